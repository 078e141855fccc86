"""The in-process `RateLimiter`: GCRA exactly as `core.ratelimit` describes it, in one dict.

For tests and single-process ``clarion dev``; every other deployment shares its limits through
Redis (`core.ratelimit_redis`, `core.ratelimit_cluster`), whose Lua script this mirrors line for line.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from core.ratelimit import EPS_US, Allowed, GcraParams, GcraPlan, LimitDecision, RetryAfter, Rule, gcra_plan


def _ceil_ms(us: float) -> int:
    return max(0, math.ceil((us - EPS_US) / 1000.0))


def _remaining(p: GcraParams, used_us: float) -> int:
    return max(0, math.floor((p.tau_us - used_us + EPS_US) / p.interval_us))


class MemoryRateLimiter:
    """In-process GCRA: exact, for tests and single-process `clarion dev`.

    ``clock`` returns monotonic seconds (injectable for tests). Keys whose bucket is full again
    are pruned, so memory follows the number of recently active keys.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # key -> (now_us when stored, TAT - that now): a TAT is never one big float accumulating
        # rounding error over a long burst, only a small offset from an exact clock reading
        self._tats: dict[str, tuple[float, float]] = {}
        self._prune_at_size = 1024

    async def acquire(self, key: str, rule: Rule, cost: int = 1) -> LimitDecision:
        """See `RateLimiter.acquire`; atomic because it never awaits."""
        return self._decide(key, gcra_plan(key, rule, cost), self._now_us())

    async def acquire_many(self, requests: list[tuple[str, Rule, int]]) -> list[LimitDecision]:
        """See `RateLimiter.acquire_many`; all requests are decided at one clock reading."""
        plans = [(key, gcra_plan(key, rule, cost)) for key, rule, cost in requests]
        now_us = self._now_us()
        return [self._decide(key, plan, now_us) for key, plan in plans]

    async def aclose(self) -> None:
        """Forget all state."""
        self._tats.clear()

    def _now_us(self) -> float:
        return self._clock() * 1e6

    def _ahead_us(self, key: str, now_us: float) -> float:
        stamp_us, ahead_us = self._tats.get(key, (now_us, 0.0))
        return max(stamp_us - now_us + ahead_us, 0.0)

    def _decide(self, key: str, plan: GcraPlan, now_us: float) -> LimitDecision:
        # Mirrors GCRA_LUA in core.ratelimit_lua line for line; "ahead" is max(tat, now) - now.
        p, cost = plan.primary, plan.cost
        if cost == 0:
            return self._look(key, plan, now_us)
        ahead = self._ahead_us(key, now_us)
        used = ahead + cost * p.interval_us
        admitted = used <= p.tau_us + EPS_US
        if admitted:
            self._store(key, now_us, used)
        rejected = RetryAfter(_ceil_ms(used - p.tau_us), _ceil_ms(ahead), _remaining(p, ahead))
        s, skey = plan.secondary, plan.secondary_key
        if s is None or skey is None:
            return Allowed(_remaining(p, used), _ceil_ms(used)) if admitted else rejected
        s_ahead = self._ahead_us(skey, now_us)
        s_used = s_ahead + cost * s.interval_us
        s_admits = s_used <= s.tau_us + EPS_US
        if plan.mode == "soft":
            if not admitted:
                return RetryAfter(rejected.retry_after_ms, rejected.reset_after_ms, 0)
            if s_admits:
                self._store(skey, now_us, s_used)
                return Allowed(_remaining(s, s_used), _ceil_ms(s_used))
            return Allowed(0, _ceil_ms(s_ahead), over_limit=True)
        if plan.mode == "elastic_read":  # the pool's owner charges it; only read it
            if admitted:
                return Allowed(_remaining(p, used), _ceil_ms(used))
            return Allowed(0, _ceil_ms(ahead), over_limit=True) if s_admits else rejected
        if admitted:  # elastic: charge the pool so it measures aggregate pace, never past full
            self._store(skey, now_us, min(s_used, s.tau_us))
            return Allowed(_remaining(p, used), _ceil_ms(used))
        if s_admits:
            self._store(skey, now_us, s_used)
            return Allowed(0, _ceil_ms(ahead), over_limit=True)
        return rejected

    def _look(self, key: str, plan: GcraPlan, now_us: float) -> Allowed:
        """A cost of 0: the room under the nominal limit, nothing stored (GCRA_LUA's ``look``). A
        soft rule's room is the lesser of its own and its shadow's, and its reset the shadow's debt
        or, when its own is the tighter, the debt that makes a nominal bucket's next event wait as
        long (a look at the shadow alone promised room the charge then refused)."""
        p, ahead = plan.primary, self._ahead_us(key, now_us)
        s, skey = plan.secondary, plan.secondary_key
        if plan.mode != "soft" or s is None or skey is None:
            return Allowed(_remaining(p, ahead), _ceil_ms(ahead))
        s_ahead = self._ahead_us(skey, now_us)
        equivalent = max(s_ahead, ahead + p.interval_us - p.tau_us + s.tau_us - s.interval_us)
        return Allowed(min(_remaining(p, ahead), _remaining(s, s_ahead)), _ceil_ms(equivalent))

    def _store(self, key: str, now_us: float, ahead_us: float) -> None:
        self._tats[key] = (now_us, ahead_us)
        if len(self._tats) >= self._prune_at_size:
            self._tats = {k: v for k, v in self._tats.items() if v[0] - now_us + v[1] > 0}
            self._prune_at_size = max(1024, 2 * len(self._tats))
