"""A tenant's sending budget for what enters the shared lanes after its accept: scheduled sends
coming due (`api.release_pacing`) and redriven dead letters (``POST /v1/ops/dlq/{channel}/redrive``).

Both were counted, if at all, when they were first accepted, and both can be many at one moment:
the sends a tenant banked for one instant, the dead letters of a day's outage. Each is charged,
when it enters the lane, to **every** ``tenant`` rule of the tenant (the operator's and its own),
on the keys the API charges its immediate sends to (`api.ingress.tenant_key`), so a tenant's
sends, its releases and its redrives share one budget. (A first version charged only the rule of
the lowest average rate, and a tenant's own rule of ten million a month was it: the operator's
500/s was never asked and 50,000 banked sends went out in 3.5 s; a helper's review, 2026-11-28.)
``api_key`` rules are left out: neither is done by a key's own sends. Without a ``tenant`` rule
nothing is charged, as for immediate sends.

How much goes now: every rule is first *looked at* (a cost of 0 charges nothing and answers its
room under its nominal limit, soft rules included), then all are charged the least room. A rule
is never charged for what does not go out, except when the API takes the room between the look
and the charge (then this call admits nothing and a rule that had room keeps its charge). The
second review's case: with a rule that refused, the others kept the charge every relay run, and
50 runs ate half of a tenant's own daily allowance while nothing went out.

When the rest would go: each rule's bucket, after the charge, says when its ``k``-th further
event fits (`Room.after_s`); the ``k``-th waiting one goes when every rule has room for it. So a
rule with room to spare (a day's allowance) never spaces them, and one without sets the pace.
All of a call's tenants take two limiter round trips.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from api.ingress import tenant_key
from clarion.rules import RuleSpec, Snapshot
from core.ratelimit import Allowed, LimitDecision, RateLimiter, Rule


@dataclass(frozen=True, slots=True)
class Limit:
    """One ``tenant`` rule of one tenant, as the limiter gets it."""

    spec: RuleSpec
    rule: Rule
    key: str

    @property
    def interval_s(self) -> float:
        return self.rule.period_s / self.rule.limit


@dataclass(frozen=True, slots=True)
class Room:
    """A rule's bucket as its last answer left it: ``ahead_s`` of debt, refilled one event every
    ``interval_s``, full at ``tau_s`` (capacity x interval), all under the nominal limit."""

    spec: RuleSpec
    ahead_s: float
    interval_s: float
    tau_s: float

    def after_s(self, k: int) -> float:
        """Seconds until the ``k``-th further event (1 for the next) fits this rule."""
        return max(0.0, self.ahead_s + k * self.interval_s - self.tau_s)


@dataclass(frozen=True, slots=True)
class Grant:
    """What a tenant's budget gave: ``admitted`` now (charged to every rule), and the rules'
    buckets after it, which say when each further one would go."""

    admitted: int
    rooms: tuple[Room, ...]

    def after_s(self, k: int) -> float:
        """Seconds until the ``k``-th one not admitted (1 for the first) fits every rule."""
        return self.slot(k)[0]

    def holding(self, k: int) -> RuleSpec:
        """The rule the ``k``-th one not admitted waits for."""
        return self.slot(k)[1]

    def slot(self, k: int) -> tuple[float, RuleSpec]:
        """`after_s` and `holding` in one look at the rules."""
        wait, spec = -1.0, self.rooms[0].spec
        for room in self.rooms:
            if (after := room.after_s(k)) > wait:
                wait, spec = after, room.spec
        return wait, spec


async def take(*, limiter: RateLimiter, rules: Snapshot, tenant_id: str, wanted: int) -> Grant | None:
    """Charge up to ``wanted`` (at least 1) to the tenant's ``tenant`` rules; None when it has none."""
    return (await take_many(limiter=limiter, rules=rules, wanted={tenant_id: wanted})).get(tenant_id)


async def take_many(*, limiter: RateLimiter, rules: Snapshot, wanted: Mapping[str, int]) -> dict[str, Grant]:
    """`take` for several tenants at once; a tenant without a ``tenant`` rule, or asking for
    nothing, is left out."""
    limits = {
        tenant_id: [Limit(spec, spec.to_rule(), tenant_key(spec, tenant_id)) for spec in specs]
        for tenant_id, count in wanted.items()
        if count > 0 and (specs := rules.for_tenant("tenant", tenant_id))
    }
    looks = await _ask(limiter, {t: (ls, 0) for t, ls in limits.items()})
    fits = {t: min(wanted[t], *(_room(d) for d in looks[t])) for t in limits}
    charges = await _ask(limiter, {t: (limits[t], n) for t, n in fits.items() if n > 0})
    grants: dict[str, Grant] = {}
    for tenant_id, tenant_limits in limits.items():
        charged = charges.get(tenant_id, [])
        admitted = fits[tenant_id] if charged and all(isinstance(d, Allowed) for d in charged) else 0
        answers = charged if admitted else looks[tenant_id]
        rooms = tuple(_bucket(lim, d) for lim, d in zip(tenant_limits, answers, strict=True))
        grants[tenant_id] = Grant(admitted, rooms)
    return grants


def _room(decision: LimitDecision) -> int:
    return decision.remaining if isinstance(decision, Allowed) else 0


def _bucket(limit: Limit, decision: LimitDecision) -> Room:
    interval_s = limit.interval_s
    return Room(limit.spec, decision.reset_after_ms / 1000, interval_s, limit.rule.capacity * interval_s)


async def _ask(
    limiter: RateLimiter, asks: Mapping[str, tuple[list[Limit], int]]
) -> dict[str, list[LimitDecision]]:
    """Ask every rule of every tenant for its tenant's count (0: a look), in one round trip."""
    requests = [(lim.key, lim.rule, cost) for limits, cost in asks.values() for lim in limits]
    decisions = iter(await limiter.acquire_many(requests) if requests else [])
    return {t: [next(decisions) for _ in limits] for t, (limits, _) in asks.items()}
