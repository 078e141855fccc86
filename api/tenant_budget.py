"""A tenant's sending budget for what enters the shared lanes after its accept: scheduled sends
coming due (`api.release_pacing`) and redriven dead letters (``POST /v1/ops/dlq/{channel}/redrive``).

Both were counted, if at all, when they were first accepted, and both can be many at one moment:
the sends a tenant banked for one instant, the dead letters of a day's outage. Each is charged,
when it enters the lane, to **every** ``tenant`` rule of the tenant (the operator's and its own),
on the keys the API charges its immediate sends to (`api.ingress.tenant_key`), so a tenant's
sends, its releases and its redrives share one budget. A first version charged only the rule of
the lowest average rate, and a tenant's own rule of ten million a month (3.7/s, room for ten
million at once) was that rule: the operator's 500/s was never asked and 50,000 banked sends went
out in 3.5 s (a helper's review, 2026-11-28). ``api_key`` rules are left out: neither is done by
a key's own sends. Without a ``tenant`` rule nothing is charged, as for immediate sends.

How much is admitted: every rule is asked for the same count, the most the smallest bucket could
hold; when some refuse and say how many they would admit now, those are asked again for the
least of those. Rules that admitted the first count keep that charge even when less goes out (a
rule is never passed; a looser one may give up a little room). All of a call's tenants are
decided in at most two limiter round trips.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from api.ingress import tenant_key
from clarion.rules import RuleSpec, Snapshot
from core.ratelimit import LimitDecision, RateLimiter, RetryAfter, Rule


@dataclass(frozen=True, slots=True)
class Grant:
    """What a tenant's budget gave: ``admitted`` now (charged), the seconds until the next one
    would be, and ``step_s`` between later ones (the slowest rule's among those whose bucket the
    count overflows); ``rule`` names the rule that holds the rest back."""

    rule: RuleSpec
    admitted: int
    wait_s: float
    step_s: float


async def take(*, limiter: RateLimiter, rules: Snapshot, tenant_id: str, wanted: int) -> Grant | None:
    """Charge up to ``wanted`` to the tenant's ``tenant`` rules; None when it has none."""
    return (await take_many(limiter=limiter, rules=rules, wanted={tenant_id: wanted})).get(tenant_id)


async def take_many(*, limiter: RateLimiter, rules: Snapshot, wanted: Mapping[str, int]) -> dict[str, Grant]:
    """`take` for several tenants at once; tenants without a ``tenant`` rule are left out."""
    asks: dict[str, tuple[list[tuple[RuleSpec, Rule]], int]] = {}
    for tenant_id, count in wanted.items():
        limits = [(spec, spec.to_rule()) for spec in rules.for_tenant("tenant", tenant_id)]
        if limits and count > 0:
            asks[tenant_id] = (limits, min(count, *(rule.capacity for _, rule in limits)))
    first = await _acquire(limiter, {t: (limits, cost) for t, (limits, cost) in asks.items()})
    again: dict[str, tuple[list[tuple[RuleSpec, Rule]], int]] = {}
    for tenant_id, (limits, _) in asks.items():
        refused = [
            (s, r) for (s, r), d in zip(limits, first[tenant_id], strict=True) if isinstance(d, RetryAfter)
        ]
        room = min((d.remaining for d in first[tenant_id] if isinstance(d, RetryAfter)), default=0)
        if refused and room > 0:
            again[tenant_id] = (refused, room)
    second = await _acquire(limiter, again)
    grants: dict[str, Grant] = {}
    for tenant_id, (limits, cost) in asks.items():
        # The rules whose bucket the count overflows set the pace: one with room for all of them
        # at once (a month's allowance, say) would slow them for nothing.
        binding = [sr for sr in limits if sr[1].capacity < wanted[tenant_id]] or limits
        step_s = max(rule.period_s / rule.limit for _, rule in binding)
        slowest = max(binding, key=lambda sr: sr[1].period_s / sr[1].limit)[0]
        decided = list(zip(limits, first[tenant_id], strict=True))
        if tenant_id in again:
            cost = again[tenant_id][1]
            decided = list(zip(again[tenant_id][0], second[tenant_id], strict=True))
        refusals = [(spec, rule, d) for (spec, rule), d in decided if isinstance(d, RetryAfter)]
        if not refusals:
            grants[tenant_id] = Grant(slowest, cost, step_s, step_s)
            continue
        # Refused: each answer is when ``cost`` would fit; one fits ``cost - 1`` slots sooner.
        waits = [(max(r.period_s / r.limit, d.retry_after_ms / 1000 - (cost - 1) * r.period_s / r.limit), s)
                 for s, r, d in refusals]  # fmt: skip
        wait_s, holding = max(waits, key=lambda w: w[0])
        grants[tenant_id] = Grant(holding, 0, max(wait_s, step_s), step_s)
    return grants


async def _acquire(
    limiter: RateLimiter, asks: Mapping[str, tuple[list[tuple[RuleSpec, Rule]], int]]
) -> dict[str, list[LimitDecision]]:
    """Ask every rule of every tenant for its tenant's count, in one round trip."""
    requests = [
        (tenant_key(spec, t), rule, cost) for t, (limits, cost) in asks.items() for spec, rule in limits
    ]
    decisions = iter(await limiter.acquire_many(requests) if requests else [])
    return {t: [next(decisions) for _ in limits] for t, (limits, _) in asks.items()}
