"""Pacing scheduled sends as they come due: a tenant's ``tenant`` rule also holds its releases.

A scheduled send (``send_at``) is counted by the tenant's ingress rules when it is accepted,
maybe weeks before it is due. Released all at once, the sends a tenant banks for one instant
flood the shared lane: 102,100 accepted at 2,000/s for one moment made another tenant's
immediate sends wait 90 s behind them (2026-11-28, a helper's probe). So the relay charges each
release to the tenant's ``tenant`` rules, on the very keys the API charges its immediate sends
to (`api.tenant_budget`): what a tenant puts into the lanes, sent now or coming due, shares one
budget.

For each tenant among a relay pass's due ``scheduled`` rows, oldest first:

- as many as its rules have room for now are released;
- the rest wait: their ``not_before`` moves to the times every rule would have room for them
  (`api.tenant_budget.Grant.after_s`), queued after the slots this relay already gave the
  tenant's held rows in the next ``HOLD_AHEAD``. (A first version started every pass's holds at
  "now": 100,000 rows of one tenant shared the first pass's slots and came due together again
  and again, 2.5 M holds in all, and another tenant's 120 sends due at the same instant waited
  85-144 s behind them; a helper's review, 2026-11-28.) A hold is at most ``HOLD_AHEAD`` long:
  the row is then looked at again, under the rules then in force. The row stays ``scheduled``;
  its history gains one entry naming the rule (not one per move);
- one whose slot is past `core.horizon.MAX_WAIT` after its ``send_at`` ends ``throttled`` at
  once, naming the rule, as a worker's hold past the horizon does (a rule loosened later does
  not bring it back);
- the relay's further passes of the same run leave the tenant's due ``scheduled`` rows out
  (``ReleasePlan.spent``: its budget has no room now), so they reach other tenants' rows instead
  of 2,000 more of the same backlog; the next run takes the next 2,000 of it.

Only ``scheduled`` rows never released are paced. A released one picked again (no worker took
it within ``CLARION_RELAY_STALE_QUEUED_S``) is a recovery, as are the relay's other rows: they
were counted when they first entered a lane (a publish that failed, a worker that died, a broker
that lost data), and retries and holds are paced by the workers' own rules. Without any
``tenant`` rule nothing is held. A tenant whose immediate sends keep its budget busy holds back
its own scheduled sends (it asked for more than its budget); no other tenant waits for them.

Without Redis (``CLARION_REDIS_URL``) the relay counts its releases alone, apart from the API's
count; with Redis unreachable the limiter fails open, and each pass may release a full bucket per
tenant. Each relay queues its own slots, so several relays overlap theirs (the limiter still
admits no more than the rules; an overlapped row is held once more).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncEngine

from api.tenant_budget import take_many
from clarion import metrics
from clarion.rules import RulesCache, RuleSpec
from core.horizon import MAX_WAIT
from core.ratelimit import RateLimiter

# A row is held at most this far ahead, then looked at again: a rule the tenant loosens or
# deletes reaches its held rows within it, instead of at the slots the old rule gave them. The
# cost is one more update of each row held further, every HOLD_AHEAD (the held rows / 300 a
# second; 100,000 rows behind a rule of one a minute: ~330). A row whose slot is past its
# horizon is throttled at once, not moved every 5 minutes for a month (a hostile probe: a tenant
# adding a rule of one a month over its banked sends made each one ~8,640 updates). Looking
# again half-way was tried (c4ff726) and undone: a row looked at again lost its place in the
# queue and was moved every few minutes anyway, out of order (a review's simulation: 141 moves a
# row on average for 300 rows at one an hour). So was parking a row until shortly before its real
# turn with a look again on rule changes (99d7ce0, 2.0 updates a row instead of 300 in
# `python -m bench.release_queue`): its queue's end lived in the relay's memory, and a review found
# a cancelled backlog still delaying the tenant's later sends by up to 30 days, a rule change lost
# to a relay restart, two relays at 34 updates a row, and the look again scanning 5-8 s.
HOLD_AHEAD = timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class DueRow:
    """A notification the relay's pass picked: what republishing it needs, and what pacing reads."""

    id: UUID
    created_at: datetime
    tenant_id: str
    channel: str
    user_id: UUID
    priority: str
    traceparent: str | None
    due_at: datetime  # send_at, or created_at for a row sent at once
    paced: bool  # a scheduled row never released (a released one re-picked is a recovery)


@dataclass(frozen=True, slots=True)
class Hold:
    """A scheduled row the tenant's rule does not admit yet: due again ``after_s`` from now. An
    offset, not a time: the database adds it to its own ``now()``, the clock the relay's pick
    compares ``not_before`` with (a relay clock 5 s behind made held rows due at once: 145,581
    holds for 5,000 rows instead of 11,624, a helper's review)."""

    row: DueRow
    after_s: float
    rule: RuleSpec


@dataclass(frozen=True, slots=True)
class ReleasePlan:
    """What one pass does with its due rows: publish, hold back, or end ``throttled``."""

    release: tuple[DueRow, ...]
    hold: tuple[Hold, ...]
    throttle: tuple[Hold, ...]  # would be held past the horizon: ends ``throttled``
    spent: frozenset[str]  # tenants whose budget held rows back: the pass's further picks skip them


class ReleasePacing:
    """Decides, for a pass's due rows, which go to the broker now (see module docstring)."""

    def __init__(
        self,
        rules: RulesCache,
        limiter: RateLimiter,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.rules = rules
        self.limiter = limiter
        self._clock = clock
        # tenant -> the last slot given to a held row of its: the next pass's holds queue after it
        self._next_slot: dict[str, datetime] = {}

    @classmethod
    def from_engine(cls, engine: AsyncEngine, limiter: RateLimiter) -> ReleasePacing:
        """Pacing with the rules read through ``engine`` (the relay's own connections)."""

        async def fetch(sql: str) -> Sequence[Mapping[str, Any]]:
            async with engine.connect() as conn:
                return cast(Sequence[Mapping[str, Any]], (await conn.exec_driver_sql(sql)).mappings().all())

        return cls(RulesCache(fetch), limiter)

    async def plan(self, rows: Sequence[DueRow]) -> ReleasePlan:
        """Split ``rows`` into those released now, those held back, and those past the horizon;
        ``rows`` in the order to release them (oldest first)."""
        paced: dict[str, list[DueRow]] = defaultdict(list)
        for row in rows:
            if row.paced:
                paced[row.tenant_id].append(row)
        if not paced:
            return ReleasePlan(tuple(rows), (), (), frozenset())
        snapshot = await self.rules.current()
        wanted = {tenant_id: len(waiting) for tenant_id, waiting in paced.items()}
        grants = await take_many(limiter=self.limiter, rules=snapshot, wanted=wanted)
        hold: list[Hold] = []
        throttle: list[Hold] = []
        now = self._clock()
        for tenant_id, grant in grants.items():
            waiting = paced[tenant_id][grant.admitted :]
            # Slots from the rules' buckets (the k-th waiting one when every rule has room for
            # it), moved past the slots this relay gave the tenant's earlier holds.
            first, gap = grant.after_s(1), grant.after_s(2) - grant.after_s(1)
            last = self._next_slot.get(tenant_id)
            shift = max(0.0, (last - now).total_seconds() + gap - first) if last is not None else 0.0
            dropped = 0
            # The last real turn given. A row held to the cap holds none: counted as one, the
            # room at the turn after it went to whichever later pass came due first, one row of a
            # backlog larger than a pass every 5 minutes (`python -m bench.release_queue`, 3,000
            # rows behind one a minute: 498 rows out of order, one 8.3 h past its place; now 0).
            turn = last
            floor_s = min(room.interval_s for room in grant.rooms)  # the API took the room looked at
            for k, row in enumerate(waiting, start=1):
                after_s, rule = grant.slot(k)
                slot_s = (after_s or k * floor_s) + shift
                at = now + timedelta(seconds=min(slot_s, HOLD_AHEAD.total_seconds()))
                held = Hold(row, (at - now).total_seconds(), rule)
                if now + timedelta(seconds=slot_s) > row.due_at + MAX_WAIT:  # its slot is past its horizon
                    throttle.append(held)
                    dropped += 1
                else:
                    hold.append(held)
                    if slot_s <= HOLD_AHEAD.total_seconds():
                        turn = now + timedelta(seconds=slot_s)
            if turn is not None:
                self._next_slot[tenant_id] = turn
            decisions = metrics.RATELIMIT_DECISIONS
            for label, decision, n in (
                (grant.rooms[0].spec.metric_label, "allowed", grant.admitted),
                (grant.holding(1).metric_label, "delayed", len(waiting) - dropped),
                (grant.holding(1).metric_label, "dropped", dropped),
            ):
                decisions.labels(label, decision).inc(n)
        if len(self._next_slot) > 10_000:  # slots passed reserve nothing
            self._next_slot = {t: slot for t, slot in self._next_slot.items() if slot > now}
        waits = {h.row.id for h in (*hold, *throttle)}
        spent = frozenset(h.row.tenant_id for h in (*hold, *throttle))
        return ReleasePlan(tuple(r for r in rows if r.id not in waits), tuple(hold), tuple(throttle), spent)
