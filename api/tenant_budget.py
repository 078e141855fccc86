"""A tenant's sending budget for what enters the shared lanes after its accept: scheduled sends
coming due (`api.release_pacing`) and redriven dead letters (``POST /v1/ops/dlq/{channel}/redrive``).

Both were counted, if at all, when they were first accepted, and both can be many at one moment:
the sends a tenant banked for one instant, the dead letters of a day's outage. Each is charged,
when it enters the lane, to the tenant's slowest ``tenant`` rule on the key the API charges its
immediate sends to (`api.ingress.tenant_key`), so a tenant's sends, its releases and its redrives
share one budget. ``api_key`` rules are left out: neither is done by a key's own sends. Without a
``tenant`` rule nothing is charged (``take`` answers None), as for immediate sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from api.ingress import tenant_key
from clarion.rules import RuleSpec, Snapshot
from core.ratelimit import Allowed, RateLimiter, RetryAfter


@dataclass(frozen=True, slots=True)
class Grant:
    """What the tenant's budget gave: ``admitted`` now (charged) of those asked, and the seconds
    until the next one would be (``step_s`` apart after that) under ``rule``."""

    rule: RuleSpec
    admitted: int
    wait_s: float
    step_s: float


async def take(*, limiter: RateLimiter, rules: Snapshot, tenant_id: str, wanted: int) -> Grant | None:
    """Charge up to ``wanted`` to the tenant's slowest ``tenant`` rule; None when it has none."""
    spec = slowest(rules.for_tenant("tenant", tenant_id))
    if spec is None:
        return None
    rule = spec.to_rule()
    step_s = rule.period_s / rule.limit
    key = tenant_key(spec, tenant_id)
    cost = min(wanted, rule.capacity)
    decision = await limiter.acquire(key, rule, cost)
    if isinstance(decision, RetryAfter) and decision.remaining > 0:
        cost = min(cost, decision.remaining)
        decision = await limiter.acquire(key, rule, cost)
    if isinstance(decision, Allowed):
        return Grant(spec, cost, step_s, step_s)
    # Refused whole: the answer is when ``cost`` would fit; one fits ``cost - 1`` slots sooner.
    return Grant(spec, 0, max(step_s, decision.retry_after_ms / 1000 - (cost - 1) * step_s), step_s)


def slowest(specs: Sequence[RuleSpec]) -> RuleSpec | None:
    """The rule that admits the fewest sends a second (the smaller burst on a tie), or None."""
    return min(specs, key=lambda s: (s.limit / s.period_s, s.limit + s.burst), default=None)
