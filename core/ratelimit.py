"""Throttling: one `RateLimiter` interface, GCRA as the algorithm, two backends.

GCRA (the generic cell rate algorithm) is a token bucket stored as one number per key: the
*theoretical arrival time* (TAT), the instant at which the bucket will be full again. For a
`Rule` the limiter derives:

- emission interval ``T = period_s / limit`` (one event refills every ``T`` seconds),
- capacity ``C = limit + burst`` events (what a full bucket admits at once),
- tolerance ``tau = C * T`` seconds.

A request of ``cost`` at time ``now`` computes ``new_tat = max(tat, now) + cost * T`` and is
admitted iff ``new_tat - now <= tau``; only an admitted request stores ``new_tat``. So an idle key
admits ``C`` events at once and then one every ``T``: over any window starting from a full
bucket, ``admitted <= limit * elapsed_s / period_s + C``. A rejected request never changes state.

Modes:

- ``hard``: the above.
- ``soft``: the limit is nominal; up to ``overshoot_pct`` more is admitted (rate and capacity
  scaled by ``1 + overshoot_pct / 100``). A shadow key tracks the hard rule with the nominal
  limit; admissions it would have rejected are `Allowed` with ``over_limit=True``, and
  ``remaining``/``reset_after_ms`` describe the nominal limit.
- ``elastic``: the key keeps its own hard allowance and may *borrow* from a shared pool when the
  pool has spare capacity. The pool is a second GCRA key (`ElasticPool`) that measures the
  aggregate pace of everything sharing it (e.g. a provider account). By default every admission
  of an elastic rule is charged to the pool (capped at "pool full"), and a request over the key's
  own limit is admitted only when the pool admits it. A *read-only* pool is one its owner
  charges itself (a provider pacing key the same send was already charged to): the elastic rule
  never charges it, and borrows only while the pool would still admit ``cost`` more right now
  (for a soft pool, under its nominal limit). Borrowed admissions are ``over_limit=True``.

`core.ratelimit_memory` decides in process; `core.ratelimit_redis` (one Redis) and
`core.ratelimit_cluster` (Redis Cluster) evaluate the same arithmetic in the Lua script of
`core.ratelimit_lua`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol, TypeAlias

# Decisions are computed in microseconds; this slack absorbs float rounding so that a request
# exactly at the edge is admitted. Mirrored in the Lua script.
EPS_US = 1.0


@dataclass(frozen=True, slots=True)
class ElasticPool:
    """A shared GCRA key an elastic rule borrows spare capacity from (see module docstring).

    ``key`` and ``rule`` are the pool's as its owner uses them. ``read_only``: the owner charges
    the pool for every event itself, so the elastic rule only reads it and never charges it.
    """

    key: str
    rule: Rule
    read_only: bool = False


MIN_PERIOD_S = 0.001
MIN_INTERVAL_US = 1.0  # one event per microsecond: the finest rate both backends represent
MAX_COUNT = 2**53  # limit and burst stay exact in a double (the Lua script) and in int64
# The API allows a month; adaptive pacing stretches a period up to 16x: ten years covers both.
MAX_PERIOD_S = 10 * 366 * 24 * 3600.0
MAX_OVERSHOOT_PCT = 1000.0  # as the API allows
# A full bucket refills within 2**50 s (the API's worst, a month x 10^7 burst, paced 16x slower, is
# 4.3e14 s): every millisecond figure (reset_after_ms, retry_after_ms, the key's PX; integers in
# the Lua script) stays 8x inside int64. A period of 1e300 s made Redis answer "value is not an
# integer or out of range".
MAX_REFILL_S = 2.0**50


class InvalidRule(ValueError):
    """Rule parameters no limiter can enforce (a rate of 10^7 per 5e-324 s divides by ~0)."""


def check_rule_parameters(
    *, rule_id: str, limit: int, period_s: float, burst: int = 0, overshoot_pct: float = 0.0
) -> None:
    """Raise ``InvalidRule`` unless: ``1 <= limit`` and ``0 <= burst`` within 2**53, ``period_s``
    finite, from 1 ms to ten years, at most one event per microsecond, a full bucket refilled within
    ``MAX_REFILL_S``, ``overshoot_pct`` in 0..1000. Then no figure a limiter computes divides by
    ~0 or leaves int64."""
    problems = []
    counts_ok = 1 <= limit <= MAX_COUNT and 0 <= burst <= MAX_COUNT
    if not counts_ok:
        problems.append(f"limit in 1..{MAX_COUNT} and burst in 0..{MAX_COUNT}")
    if not (math.isfinite(period_s) and MIN_PERIOD_S <= period_s <= MAX_PERIOD_S):
        problems.append(f"a finite period_s from {MIN_PERIOD_S} to {MAX_PERIOD_S:.0f} s")
    elif counts_ok and period_s * 1e6 / limit < MIN_INTERVAL_US:
        problems.append("at most one event per microsecond (period_s / limit >= 1e-6)")
    elif counts_ok and period_s * (limit + burst) / limit > MAX_REFILL_S:
        problems.append(
            f"a full bucket refilled within {MAX_REFILL_S:.0f} s (period_s * (limit + burst) / limit)"
        )
    if not (math.isfinite(overshoot_pct) and 0 <= overshoot_pct <= MAX_OVERSHOOT_PCT):
        problems.append(f"overshoot_pct from 0 to {MAX_OVERSHOOT_PCT:.0f}")
    if problems:
        raise InvalidRule(f"rule {rule_id!r} needs " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class Rule:
    """What a limiter enforces for one key.

    ``limit`` events per ``period_s`` steady rate; a full bucket admits ``limit + burst`` events at
    once (burst=0: ``limit`` at once). ``rule_id`` labels metrics. ``overshoot_pct`` applies to
    ``soft`` mode; ``elastic_pool`` is required by ``elastic`` mode.
    """

    rule_id: str
    limit: int
    period_s: float
    burst: int = 0
    mode: Literal["hard", "soft", "elastic"] = "hard"
    overshoot_pct: float = 0.0
    elastic_pool: ElasticPool | None = None

    def __post_init__(self) -> None:
        check_rule_parameters(
            rule_id=self.rule_id, limit=self.limit, period_s=self.period_s, burst=self.burst,
            overshoot_pct=self.overshoot_pct,
        )  # fmt: skip
        if self.mode == "elastic" and self.elastic_pool is None:
            raise ValueError(f"rule {self.rule_id!r}: elastic mode needs an elastic_pool")
        if self.elastic_pool is not None and self.elastic_pool.rule.mode == "elastic":
            raise ValueError(f"rule {self.rule_id!r}: an elastic pool cannot itself be elastic")

    @property
    def capacity(self) -> int:
        """Events a full bucket admits at once under the nominal limit."""
        return self.limit + self.burst


@dataclass(frozen=True, slots=True)
class Allowed:
    """The request was admitted.

    ``remaining``: further cost-1 requests the nominal limit admits right now.
    ``reset_after_ms``: time until the bucket is full again (the ``RateLimit-Reset`` value).
    ``over_limit``: admitted beyond the nominal limit (soft overshoot or elastic borrowing).
    """

    remaining: int
    reset_after_ms: int
    over_limit: bool = False

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """The request was rejected and changed nothing.

    ``retry_after_ms``: the same request is admitted if retried this many ms later, provided
    nothing else consumes the key meanwhile; never earlier than that. ``remaining``: cost-1
    requests that would still be admitted now (non-zero when ``cost`` was the obstacle).
    """

    retry_after_ms: int
    reset_after_ms: int
    remaining: int = 0

    def __bool__(self) -> bool:
        return False


LimitDecision: TypeAlias = Allowed | RetryAfter


class RateLimiter(Protocol):
    """Admits or rejects requests against per-key `Rule`s, shared by everything using one store."""

    async def acquire(self, key: str, rule: Rule, cost: int = 1) -> LimitDecision:
        """Decide one request of ``cost`` events on ``key`` atomically; raises ValueError if
        ``cost`` can never fit the rule's capacity. ``cost`` 0 charges nothing: it reads the key's
        room (``Allowed.remaining`` and ``reset_after_ms`` under the nominal limit)."""
        ...

    async def acquire_many(self, requests: list[tuple[str, Rule, int]]) -> list[LimitDecision]:
        """Decide ``(key, rule, cost)`` requests in order, as if by sequential `acquire` calls."""
        ...

    async def aclose(self) -> None:
        """Release connections; the limiter must not be used afterwards."""
        ...


def rate_limit_headers(rule: Rule, decision: LimitDecision) -> dict[str, str]:
    """HTTP headers for a decision: ``RateLimit-Limit/Remaining/Reset`` and, when rejected,
    ``Retry-After``; seconds are rounded up so a client honouring them is not rejected again."""
    headers = {
        "RateLimit-Limit": str(rule.limit),
        "RateLimit-Remaining": str(decision.remaining),
        "RateLimit-Reset": str(math.ceil(decision.reset_after_ms / 1000)),
    }
    if isinstance(decision, RetryAfter):
        headers["Retry-After"] = str(math.ceil(decision.retry_after_ms / 1000))
    return headers


NOMINAL_SUFFIX = "|nominal"
"""Soft rules keep a shadow key ``key + NOMINAL_SUFFIX``: the state a hard rule would have."""


@dataclass(frozen=True, slots=True)
class GcraParams:
    """One GCRA check in microseconds: admit iff ``max(tat, now) + cost * interval_us - now <= tau_us``."""

    interval_us: float
    tau_us: float


@dataclass(frozen=True, slots=True)
class GcraPlan:
    """What both backends evaluate for one request.

    ``primary`` decides admission on the key. ``secondary`` on ``secondary_key`` is, in soft mode,
    the nominal (hard) rule on the shadow key, advanced only when it would admit; in elastic mode,
    the pool, charged on every admission (capped at full) and consulted when ``primary`` rejects;
    in elastic_read mode, the pool, only consulted when ``primary`` rejects and never charged.
    """

    mode: Literal["hard", "soft", "elastic", "elastic_read"]
    cost: int
    primary: GcraParams
    secondary: GcraParams | None
    secondary_key: str | None


def _params(rule: Rule, scale: float = 1.0) -> GcraParams:
    interval_us = rule.period_s * 1e6 / (rule.limit * scale)
    return GcraParams(interval_us, rule.capacity * scale * interval_us)


def gcra_plan(key: str, rule: Rule, cost: int) -> GcraPlan:
    """The plan for ``cost`` events of ``rule`` on ``key``; raises ValueError if it never fits."""
    if cost < 0:
        raise ValueError(f"cost must be >= 0, got {cost}")
    if rule.mode == "soft":
        primary = _params(rule, 1.0 + rule.overshoot_pct / 100.0)
        plan = GcraPlan("soft", cost, primary, _params(rule), key + NOMINAL_SUFFIX)
    elif rule.mode == "elastic" and rule.elastic_pool is not None:
        pool = rule.elastic_pool
        if not pool.read_only:
            plan = GcraPlan("elastic", cost, _params(rule), _params(pool.rule), pool.key)
        else:  # spare capacity under the pool's nominal limit: a soft pool's shadow key
            pool_key = pool.key + NOMINAL_SUFFIX if pool.rule.mode == "soft" else pool.key
            plan = GcraPlan("elastic_read", cost, _params(rule), _params(pool.rule), pool_key)
    else:
        plan = GcraPlan("hard", cost, _params(rule), None, None)
    if cost * plan.primary.interval_us > plan.primary.tau_us + EPS_US:
        raise ValueError(f"rule {rule.rule_id!r}: cost {cost} exceeds capacity {rule.capacity}")
    return plan
