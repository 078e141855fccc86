"""The outbox relay: republishes from the log whatever the broker does not (or no longer) hold.

Each pass picks, with ``FOR UPDATE SKIP LOCKED`` so several relays share the work:
- ``accepted`` rows without ``queued_at`` older than the grace period (the API's publish never
  reached the broker);
- ``retrying`` / ``delayed`` / ``scheduled`` rows whose ``not_before`` has come;
- ``sending`` rows whose lease expired (a worker died between claim and record);
- queued rows (``accepted`` with ``queued_at``, or ``queued`` as written before migration 0010)
  not republished for ``stale_queued_s`` (the broker lost its data).

Due ``scheduled`` rows are paced by their tenant's ``tenant`` rule (`api.release_pacing`): the
rows it does not admit yet get a later ``not_before`` in the same transaction. A run goes on pass
after pass while a pass picks a full batch, whatever it released, each pass leaving out the
scheduled rows of the tenants an earlier pass of the run held back.

A republished message carries the notification's stored traceparent in its record headers, so
the worker's spans join the trace its accept began, however late the message comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.outbox import republish
from api.release_pacing import DueRow, ReleasePacing, ReleasePlan
from clarion import metrics
from clarion.kafka import Publisher
from clarion.rules import RuleSpec
from clarion.settings import Settings
from core.horizon import MAX_WAIT
from core.limiter import build_rate_limiter
from core.ratelimit_memory import MemoryRateLimiter

log = logging.getLogger(__name__)

DUE = """
    (status = 'accepted' AND queued_at IS NULL
     AND coalesce(published_at, created_at) < now() - make_interval(secs => $1))
 OR (status IN ('retrying', 'delayed', 'scheduled') AND not_before <= now()
     AND (published_at IS NULL OR published_at < not_before
          OR published_at < now() - make_interval(secs => $2)))
 OR (status = 'sending' AND lease_until < now()
     AND (published_at IS NULL OR published_at < lease_until
          OR published_at < now() - make_interval(secs => $2)))
 OR ((status = 'queued' OR (status = 'accepted' AND queued_at IS NOT NULL))
     AND published_at < now() - make_interval(secs => $2))
"""
PICK = f"""
    SELECT id, created_at, tenant_id, channel, user_id, priority, traceparent,
           coalesce(send_at, created_at) AS due_at,
           status = 'scheduled' AND (published_at IS NULL OR published_at < not_before) AS paced
      FROM notifications
     WHERE ({DUE})
       AND NOT (status = 'scheduled' AND tenant_id = ANY($4::text[]))
     ORDER BY created_at
     LIMIT $3
       FOR UPDATE SKIP LOCKED
"""
# Each update names the batch's created_at range besides the keys: joined to unnest() alone,
# PostgreSQL hash-joined every day partition of the log from 1,000 rows up (1.5 M rows: 7 ms for
# 600, 606-707 ms for 2,000; a helper's review, EXPLAIN ANALYZE).
_KEYS = "n.id = v.id AND n.created_at = v.created_at AND n.created_at BETWEEN ${lo} AND ${hi}"
MARK_RELEASED = f"""
    UPDATE notifications n SET published_at = now()
      FROM unnest($1::uuid[], $2::timestamptz[]) AS v(id, created_at)
     WHERE {_KEYS.format(lo=3, hi=4)}
"""
_DETAIL_CHANGED = "n.history->-1->>'detail' IS DISTINCT FROM v.detail"
_ENTRY = """jsonb_build_array(jsonb_build_object(
           'status', {status},
           'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
           'detail', v.detail))"""
# One history entry per rule that holds a row back, not one per move: a tenant that keeps its
# budget busy would otherwise grow its rows' history by an entry every emission interval.
HOLD = f"""
    UPDATE notifications n
       SET not_before = now() + make_interval(secs => v.after_s), updated_at = now(),
           history = CASE WHEN {_DETAIL_CHANGED}
                          THEN n.history || {_ENTRY.format(status="n.status")} ELSE n.history END
      FROM unnest($1::uuid[], $2::timestamptz[], $3::float8[], $4::text[]) AS v(id, created_at, after_s, detail)
     WHERE {_KEYS.format(lo=5, hi=6)}
"""
THROTTLE = f"""
    UPDATE notifications n
       SET status = 'throttled', not_before = NULL, updated_at = now(),
           error_code = 'rate_limited', error_message = v.message,
           history = n.history || {_ENTRY.format(status="'throttled'")}
      FROM unnest($1::uuid[], $2::timestamptz[], $3::text[], $4::text[]) AS v(id, created_at, message, detail)
     WHERE {_KEYS.format(lo=5, hi=6)}
"""


@dataclass(frozen=True, slots=True)
class Pass:
    picked: int  # due rows taken (released, held back or throttled)
    spent: frozenset[str]  # tenants whose scheduled rows were held: later passes of the run skip them


@dataclass
class RelayStats:
    passes: int = 0
    republished: int = 0
    held: int = 0  # scheduled rows their tenant's rule held back (api.release_pacing)


class Relay:
    """Scans the log every ``interval_s`` and republishes what is due."""

    def __init__(
        self,
        engine: AsyncEngine,
        publisher: Publisher,
        *,
        interval_s: float,
        grace_s: float,
        stale_queued_s: float,
        batch: int = 2_000,
        pacing: ReleasePacing | None = None,
    ) -> None:
        """``pacing`` defaults to the rules in ``engine``'s database counted in this process alone."""
        self.engine = engine
        self.publisher = publisher
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.stale_queued_s = stale_queued_s
        self.batch = batch
        self.pacing = pacing or ReleasePacing.from_engine(engine, MemoryRateLimiter())
        self.stats = RelayStats()

    @classmethod
    def from_settings(cls, engine: AsyncEngine, publisher: Publisher, settings: Settings) -> Relay:
        """The relay ``settings`` describe (its ``relay_*`` fields), pacing on the limiter the
        API charges (``redis_url``)."""
        limiter = build_rate_limiter(settings.redis_url, prefix=f"{settings.redis_key_prefix}rl:")
        return cls(
            engine,
            publisher,
            interval_s=settings.relay_interval_s,
            grace_s=settings.relay_grace_s,
            stale_queued_s=settings.relay_stale_queued_s,
            pacing=ReleasePacing.from_engine(engine, limiter),
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Relay]:
        """`run` in a task for the duration of the block, cancelled (and awaited) when it ends.
        The publisher and engine stay the caller's to close; the pacing's limiter is closed."""
        task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self.pacing.limiter.aclose()

    async def run_once(self, *, skip: frozenset[str] = frozenset()) -> Pass:
        """One pass, leaving out the due ``scheduled`` rows of the tenants in ``skip``."""
        # The rules are reloaded (every 2 s) here, not while the pick's row locks are held: a
        # cancel or a claim waiting on them would wait for the reload's round trip too.
        await self.pacing.rules.current()
        async with self.engine.begin() as conn:
            picked = await conn.exec_driver_sql(
                PICK, (self.grace_s, self.stale_queued_s, self.batch, sorted(skip))
            )
            rows = [DueRow(**r) for r in picked.mappings()]
            if not rows:
                return Pass(0, frozenset())
            plan = await self.pacing.plan(rows)
            await _write(conn, plan)
        self.stats.held += len(plan.hold)
        if plan.release:
            acked = await republish(engine=self.engine, publisher=self.publisher, rows=plan.release)
            self.stats.republished += acked
            metrics.RELAY_REPUBLISHED.inc(acked)
            if acked:
                log.info("relay republished %d notifications", acked)
        return Pass(len(rows), plan.spent)

    async def run(self) -> None:
        while True:
            self.stats.passes += 1
            try:
                skip: frozenset[str] = frozenset()
                while (done := await self.run_once(skip=skip)).picked >= self.batch:
                    skip |= done.spent
            except Exception:
                log.warning("relay pass failed; retrying in %.1fs", self.interval_s, exc_info=True)
            await asyncio.sleep(self.interval_s)


async def _write(conn: AsyncConnection, plan: ReleasePlan) -> None:
    """Mark the released rows published, move the held ones' ``not_before``, end the throttled."""
    if plan.release:
        await conn.exec_driver_sql(MARK_RELEASED, (*_keys(plan.release), *_range(plan.release)))
    if plan.hold:
        held = [h.row for h in plan.hold]
        after = [h.after_s for h in plan.hold]
        details = [_held_by(h.rule) for h in plan.hold]
        await conn.exec_driver_sql(HOLD, (*_keys(held), after, details, *_range(held)))
    if plan.throttle:
        ended = [h.row for h in plan.throttle]
        messages = [
            f"{_held_by(h.rule)} ({h.rule.limit} per {h.rule.period_s:g}s) past {MAX_WAIT.days} days "
            "after its send_at: not sent"
            for h in plan.throttle
        ]
        details = [f"rule {h.rule.label}" for h in plan.throttle]
        await conn.exec_driver_sql(THROTTLE, (*_keys(ended), messages, details, *_range(ended)))


def _keys(rows: Sequence[DueRow]) -> tuple[list[UUID], list[datetime]]:
    return [r.id for r in rows], [r.created_at for r in rows]


def _range(rows: Sequence[DueRow]) -> tuple[datetime, datetime]:
    return min(r.created_at for r in rows), max(r.created_at for r in rows)


def _held_by(spec: RuleSpec) -> str:
    """The history's detail: the rule by name only, so a tenant editing its numbers adds no entry."""
    return f"held by tenant rule '{spec.label}'"
