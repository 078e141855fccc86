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
- the rest wait their turn: the time every rule would have room for them
  (`api.tenant_budget.Grant.after_s`), queued after the turns this relay already gave the
  tenant's rows. (A first version started every pass's holds at "now": 100,000 rows of one
  tenant shared the first pass's slots and came due together again and again, 2.5 M holds in
  all, and another tenant's 120 sends due at the same instant waited 85-144 s behind them; a
  helper's review, 2026-11-28.) A row whose turn is within ``HOLD_AHEAD`` is held to it
  (``not_before``); one further is *parked* until ``PARK_BEFORE`` ahead of its turn, then lined
  up again at the head of the queue, after the rows held to their turns. Rows due for the first
  time go after every turn given, parked rows' included, so the queue keeps its order. The row
  stays ``scheduled``; its history gains one entry naming the rule (not one per move);
- a rule change reaches the parked rows: the relay moves the held rows of a tenant whose
  ``tenant`` rules changed back to their ``send_at``, to be queued again under the rules then in
  force (`api.rule_changes`, at most once every ``HOLD_AHEAD``);
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

from api.rule_changes import Relook, RuleChanges
from api.tenant_budget import Grant, take_many
from clarion import metrics
from clarion.rules import RulesCache, RuleSpec
from core.horizon import MAX_WAIT
from core.ratelimit import RateLimiter

# A row is held to its turn when that is at most this far ahead; one further is parked until
# PARK_BEFORE ahead of its turn and lined up again then. Before, every row held further was moved
# to HOLD_AHEAD and looked at again every HOLD_AHEAD until its turn, and the pass's 2,000-row
# batches split a backlog into groups that overtook each other. `python -m bench.release_queue`
# (the real pacing over a simulated log, 3,000 rows due at once behind one a minute), updates a
# row / rows out before an older one / the most overtaken row's time past its place:
#   alone:                       300.3 / 498 / 8.3 h  ->  2.0 / 0 / 0
#   the API taking 30%:          375.9 / 762 / 13.9 h -> 27.9 / 1,124 / 6 min (parked rows come
#                                back too early and are parked again every PARK_BEFORE)
#   rule loosened x10 after 10 h: 127.5 / 149 / 2.0 h ->  3.6 / 0 / 0 (api/rule_changes.py)
# A row whose turn is past its horizon is throttled at once (a hostile probe: a tenant adding a
# rule of one a month over its banked sends made each one ~8,640 updates under the first version).
HOLD_AHEAD = timedelta(minutes=5)
PARK_BEFORE = HOLD_AHEAD / 2


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
    held: bool = False  # held back before (``not_before`` past ``send_at``): it has a place in the queue


@dataclass(frozen=True, slots=True)
class Hold:
    """A scheduled row the tenant's rule does not admit yet: due again ``after_s`` from now. An
    offset, not a time: the database adds it to its own ``now()``, the clock the relay's pick
    compares ``not_before`` with (a relay clock 5 s behind made held rows due at once: 145,581
    holds for 5,000 rows instead of 11,624, a helper's review)."""

    row: DueRow
    after_s: float
    rule: RuleSpec
    slot_s: float  # when its turn comes; ``after_s`` is earlier when the row is parked

    @property
    def parked(self) -> bool:
        """Its turn is past ``HOLD_AHEAD``: it is looked at again ``PARK_BEFORE`` before it."""
        return self.after_s < self.slot_s


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
        self._places: dict[str, _Places] = {}  # where each tenant's queue ends
        self.changes = RuleChanges(every=HOLD_AHEAD, clock=clock)

    @classmethod
    def from_engine(cls, engine: AsyncEngine, limiter: RateLimiter) -> ReleasePacing:
        """Pacing with the rules read through ``engine`` (the relay's own connections)."""

        async def fetch(sql: str) -> Sequence[Mapping[str, Any]]:
            async with engine.connect() as conn:
                return cast(Sequence[Mapping[str, Any]], (await conn.exec_driver_sql(sql)).mappings().all())

        return cls(RulesCache(fetch), limiter)

    async def relook(self) -> Relook | None:
        """The tenants whose ``tenant`` rules changed (`api.rule_changes`), at most once every
        ``HOLD_AHEAD``: the caller moves their held rows back to their ``send_at``, and their
        queues here start again."""
        relook = self.changes.due(await self.rules.current())
        if relook is not None:
            self._places = {t: p for t, p in self._places.items() if not relook.covers(t)}
        return relook

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
            places = self._places.setdefault(tenant_id, _Places())
            held, ended = _line_up(grant, waiting, places, now)
            hold += held
            throttle += ended
            dropped = len(ended)
            decisions = metrics.RATELIMIT_DECISIONS
            for label, decision, n in (
                (grant.rooms[0].spec.metric_label, "allowed", grant.admitted),
                (grant.holding(1).metric_label, "delayed", len(waiting) - dropped),
                (grant.holding(1).metric_label, "dropped", dropped),
            ):
                decisions.labels(label, decision).inc(n)
        if len(self._places) > 10_000:  # places passed reserve nothing
            self._places = {t: p for t, p in self._places.items() if p.tail and p.tail > now}
        waits = {h.row.id for h in (*hold, *throttle)}
        spent = frozenset(h.row.tenant_id for h in (*hold, *throttle))
        return ReleasePlan(tuple(r for r in rows if r.id not in waits), tuple(hold), tuple(throttle), spent)


@dataclass(slots=True)
class _Places:
    """Where a tenant's queue ends, as this relay gave its turns."""

    window: datetime | None = None  # the last turn a row is held to, within HOLD_AHEAD
    tail: datetime | None = None  # the last turn given to any row: rows due for the first time go after it


def _line_up(
    grant: Grant, waiting: Sequence[DueRow], places: _Places, now: datetime
) -> tuple[list[Hold], list[Hold]]:
    """Turns for the rows the grant did not admit, in order: those held before first (they have a
    place, at the head of the queue: after the window), then those due for the first time (after
    every turn given, parked rows' included). Returns the holds and the rows whose turn is past
    their horizon, which end ``throttled``."""
    holds: list[Hold] = []
    ended: list[Hold] = []
    queue = [r for r in waiting if r.held] + [r for r in waiting if not r.held]
    shift = 0.0
    for k, row in enumerate(queue, start=1):
        if k == 1 or (not row.held and queue[k - 2].held):  # the first, the first new one
            shift = _shift_after(
                grant, k, now, places.window if row.held else _later(places.window, places.tail)
            )
        held = _place(grant, k, shift, row)
        at = now + timedelta(seconds=held.slot_s)
        if at > row.due_at + MAX_WAIT:  # its turn is past its horizon
            ended.append(held)
            continue
        holds.append(held)
        if not held.parked:
            places.window = _later(places.window, at)
        places.tail = _later(places.tail, at)
    return holds, ended


def _later(a: datetime | None, b: datetime | None) -> datetime | None:
    return b if a is None else a if b is None else max(a, b)


def _shift_after(grant: Grant, k: int, now: datetime, last: datetime | None) -> float:
    """Seconds to add to the rules' slots from the ``k``-th on so that it comes a slot after ``last``."""
    if last is None:
        return 0.0
    gap = grant.after_s(k + 1) - grant.after_s(k)
    return max(0.0, (last - now).total_seconds() + gap - grant.after_s(k))


def _place(grant: Grant, k: int, shift: float, row: DueRow) -> Hold:
    """The ``k``-th waiting row's turn: held to it when it is within ``HOLD_AHEAD``, else parked
    until ``PARK_BEFORE`` ahead of it."""
    after_s, rule = grant.slot(k)
    floor_s = min(room.interval_s for room in grant.rooms)  # the API took the room looked at
    slot_s = (after_s or k * floor_s) + shift
    if slot_s <= HOLD_AHEAD.total_seconds():
        return Hold(row, slot_s, rule, slot_s)
    return Hold(row, slot_s - PARK_BEFORE.total_seconds(), rule, slot_s)
