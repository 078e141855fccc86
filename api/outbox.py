"""Publishing accepted notifications to Kafka, off the request path.

The API answers ``202`` once the row is committed and hands the message here. A background task
publishes in batches and stamps the rows' ``queued_at`` (shown as ``queued``; the stored status
stays ``accepted``). Anything that never reaches the broker (broker down, process killed, queue
full) keeps ``queued_at`` empty and the relay republishes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
    """Batches messages to the broker; ``submit`` never blocks the request."""

    def __init__(
        self, pool: asyncpg.Pool, publisher: Publisher, *, max_pending: int = 20_000, max_batch: int = 1_000
    ) -> None:
        self.pool = pool
        self.publisher = publisher
        self.max_batch = max_batch
        self._queue: asyncio.Queue[NotificationMessage] = asyncio.Queue(max_pending)
        self._task: asyncio.Task[None] | None = None

    def submit(self, message: NotificationMessage) -> bool:
        """Queue for publishing; False when full (the relay will pick the row up)."""
        try:
            self._queue.put_nowait(message)
            return True
        except asyncio.QueueFull:
            return False

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="clarion-outbox")

    async def stop(self, drain_timeout_s: float = 5.0) -> None:
        """Publish what is queued (bounded by ``drain_timeout_s``), then stop."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), drain_timeout_s)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                acked = await self.publisher.publish_many(batch)
                await mark_published(self.pool, [UUID(i) for i in acked])
            except Exception:
                log.warning("outbox batch of %d not recorded as published", len(batch), exc_info=True)
            finally:
                for _ in batch:
                    self._queue.task_done()
