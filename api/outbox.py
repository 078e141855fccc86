"""Publishing accepted notifications to Kafka, off the request path.

The API answers ``202`` once the row is committed and hands the message here. A background task
publishes in batches; a second one stamps ``queued_at`` (shown as ``queued``; the stored status
stays ``accepted``) on the rows no worker has taken by ``mark_after_s`` after the broker's ack.
Anything that never reaches the broker (broker down, process killed, queue full) keeps
``queued_at`` empty and the relay republishes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.kafka import Publisher
from schema.enums import Channel, Priority
from schema.ids import created_window
from schema.messages import NotificationMessage
from schema.shown_status import STAMP_QUEUED

log = logging.getLogger(__name__)

# A HOT update when the page has room (fillfactor 80): no indexed column changes, so no index
# entry and no rewrite of ``history``; ``queued`` is shown from ``queued_at`` (schema/shown_status.py).
# Measured with pg_stat_statements on bench.e2e (README, "PostgreSQL per notification").
#
# Rows a worker holds (its claim or its record, in a transaction now) are skipped, never waited
# for: a worker can take a message before the API has marked it, and the claim and the record lock
# their rows in an order of their own plans. Waiting made deadlocks, each stalling both sides for
# PostgreSQL's deadlock_timeout (1 s; two seen under load on 2026-11-28, outbox against claim and
# against record). A skipped row needs no mark: the claim stamps ``queued_at`` itself (CLAIM), and
# the relay republishes only rows still ``accepted`` without one. The skip costs 3-6 us of
# PostgreSQL per id (``python -m bench.contention``, batches of 50 and 10 ids alternating with the
# plain UPDATE: 17.5 -> 20.5 and 37.7 -> 43.3 us; 21.1 -> 24.5 and 56.1 -> 61.9 on a second run),
# against 300-550 us of PostgreSQL per notification in bench.e2e.
MARK_PUBLISHED = f"""
    WITH free AS (
        SELECT id, created_at FROM notifications
         WHERE id = ANY($1::uuid[]) AND created_at BETWEEN $2 AND $3
           FOR UPDATE SKIP LOCKED
    )
    UPDATE notifications n
       SET published_at = now(),
           {STAMP_QUEUED}
      FROM free
     WHERE n.id = free.id AND n.created_at = free.created_at
"""


# The API's own mark, made up to ``mark_after_s`` after the broker's ack: by then a worker has
# usually claimed the row, and the claim stamped ``queued_at`` itself (CLAIM), so only the rows
# still waiting for a worker are written. Marking at once wrote a row version for nearly every
# send, one of the four a send makes (insert, ack, claim, record), for a ``published_at`` no
# reader needs once a worker holds the row: the relay's rules for every later status hold alike
# with it empty (api/relay.py, DUE).
#
# Each id is looked up on its own (LATERAL ... LIMIT 1): on a day partition without statistics
# (before autovacuum's first ANALYZE) PostgreSQL planned ``id = ANY`` of 100 ids or more as a
# scan of the day's whole ``created_at`` range (2,500-3,400 buffers for 100-1,000 ids against
# 500 and 2,100 for 100 and 420 looked up one by one, EXPLAIN under bench.e2e, 2026-11-29). From
# ~1,000 ids the update itself turns to a sequential scan: ``MARK_IDS_AT_MOST`` per statement.
MARK_WAITING = f"""
    WITH free AS (
        SELECT w.id, w.created_at
          FROM unnest($1::uuid[]) AS v(id)
         CROSS JOIN LATERAL (
               SELECT id, created_at FROM notifications
                WHERE id = v.id AND created_at BETWEEN $2 AND $3 AND queued_at IS NULL
                LIMIT 1
                  FOR UPDATE SKIP LOCKED) w
    )
    UPDATE notifications n
       SET published_at = now(),
           {STAMP_QUEUED}
      FROM free
     WHERE n.id = free.id AND n.created_at = free.created_at
"""
MARK_IDS_AT_MOST = 250


async def mark_published(db: AsyncEngine | asyncpg.Pool, ids: list[UUID]) -> None:
    """Record that these notifications reached the broker: ``published_at``, and ``queued_at`` for
    those still ``accepted`` (shown as ``queued`` from then on).

    On the API's hot path ``db`` is its asyncpg pool: one round trip, where a SQLAlchemy
    transaction costs four (ping, begin, update, commit)."""
    if not ids:
        return
    window = created_window(ids)
    if isinstance(db, asyncpg.Pool):
        await db.execute(MARK_PUBLISHED, ids, *window)
        return
    async with db.begin() as conn:
        await conn.exec_driver_sql(MARK_PUBLISHED, (ids, *window))


async def republish(*, engine: AsyncEngine, publisher: Publisher, rows: Sequence[Any]) -> int:
    """Publish the message of each row (``id``, ``tenant_id``, ``channel``, ``user_id``,
    ``priority`` of ``notifications``) and mark those the broker acknowledged as published;
    returns how many it acknowledged. The rest stay as they are, for the relay's next pass."""
    messages = [
        NotificationMessage(
            id=r.id,
            tenant_id=r.tenant_id,
            channel=Channel(r.channel),
            user_id=r.user_id,
            priority=Priority(r.priority),
            traceparent=getattr(r, "traceparent", None),  # the accept span the trace goes on from
        )
        for r in rows
    ]
    acked = await publisher.publish_many(messages)
    await mark_published(engine, [UUID(i) for i in acked])
    return len(acked)


class Outbox:
    """Batches messages to the broker; ``submit`` never blocks the request.

    The rows the broker acknowledged are marked up to ``mark_after_s`` later (``MARK_WAITING``), which
    must stay well under the relay's grace (``relay_grace_s``): an unmarked ``accepted`` row older
    than that is republished (a duplicate message the claim dedupes, not a second send)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        publisher: Publisher,
        *,
        max_pending: int = 20_000,
        max_batch: int = 1_000,
        mark_after_s: float = 1.0,
    ) -> None:
        self.pool = pool
        self.publisher = publisher
        self.max_batch = max_batch
        self.mark_after_s = mark_after_s
        self._queue: asyncio.Queue[NotificationMessage] = asyncio.Queue(max_pending)
        self._acked: deque[tuple[float, list[UUID]]] = deque()  # (ack time, ids), oldest first
        self._wake = asyncio.Event()  # a first batch was acked, or stop() wants the marks now
        self._marked = asyncio.Event()  # nothing acked is left unmarked
        self._marked.set()
        self._tasks: list[asyncio.Task[None]] = []

    def submit(self, message: NotificationMessage) -> bool:
        """Queue for publishing; False when full (the relay will pick the row up)."""
        try:
            self._queue.put_nowait(message)
            return True
        except asyncio.QueueFull:
            return False

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name="clarion-outbox"),
            asyncio.create_task(self._mark(), name="clarion-outbox-mark"),
        ]

    async def stop(self, drain_timeout_s: float = 5.0) -> None:
        """Publish what is queued and mark what the broker acknowledged, without waiting
        ``mark_after_s`` (bounded by ``drain_timeout_s``), then stop."""
        if not self._tasks:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(drain_timeout_s):
                await self._queue.join()
                self.mark_after_s = 0.0
                self._wake.set()
                await self._marked.wait()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                acked = await self.publisher.publish_many(batch)
                if acked:
                    if not self._acked:
                        self._wake.set()  # the mark task waits for a first batch, not for a time
                    self._acked.append((loop.time(), [UUID(i) for i in acked]))
                    self._marked.clear()
            except Exception:
                log.warning("outbox batch of %d not published", len(batch), exc_info=True)
            finally:
                for _ in batch:
                    self._queue.task_done()

    async def _mark(self) -> None:
        """Mark each acknowledged batch between ``mark_after_s / 2`` and ``mark_after_s`` after its ack."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._acked:
                self._marked.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            wait_s = self._acked[0][0] + self.mark_after_s - loop.time()
            if wait_s > 0:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._wake.wait()  # set early only by stop()
                continue
            # The batches acked in the half interval after the due one go with it: at most two
            # marks per ``mark_after_s``, each planned once for many batches.
            ids: list[UUID] = []
            last = self._acked[0][0] + self.mark_after_s / 2
            while self._acked and self._acked[0][0] <= last and len(ids) < self.max_batch:
                ids += self._acked.popleft()[1]
            for start in range(0, len(ids), MARK_IDS_AT_MOST):
                chunk = ids[start : start + MARK_IDS_AT_MOST]
                try:
                    await self.pool.execute(MARK_WAITING, chunk, *created_window(chunk))
                except Exception:
                    log.warning("outbox batch of %d not recorded as published", len(chunk), exc_info=True)
