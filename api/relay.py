"""The outbox relay: republishes from the log whatever the broker does not (or no longer) hold.

Each pass picks, with ``FOR UPDATE SKIP LOCKED`` so several relays share the work:
- ``accepted`` rows without ``queued_at`` older than the grace period (the API's publish never
  reached the broker);
- ``retrying`` / ``delayed`` / ``scheduled`` rows whose ``not_before`` has come;
- ``sending`` rows whose lease expired (a worker died between claim and record);
- queued rows (``accepted`` with ``queued_at``, or ``queued`` as written before migration 0010)
  not republished for ``stale_queued_s`` (the broker lost its data).

A republished message carries the notification's stored traceparent in its record headers, so
the worker's spans join the trace its accept began, however late the message comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.outbox import republish
from clarion import metrics
from clarion.kafka import Publisher
from clarion.settings import Settings

log = logging.getLogger(__name__)

PICK = sa.text(
    """
    WITH due AS (
        SELECT id, created_at FROM notifications
         WHERE (status = 'accepted' AND queued_at IS NULL
                AND coalesce(published_at, created_at) < now() - make_interval(secs => :grace_s))
            OR (status IN ('retrying', 'delayed', 'scheduled') AND not_before <= now()
                AND (published_at IS NULL OR published_at < not_before
                     OR published_at < now() - make_interval(secs => :stale_s)))
            OR (status = 'sending' AND lease_until < now()
                AND (published_at IS NULL OR published_at < lease_until
                     OR published_at < now() - make_interval(secs => :stale_s)))
            OR ((status = 'queued' OR (status = 'accepted' AND queued_at IS NOT NULL))
                AND published_at < now() - make_interval(secs => :stale_s))
         ORDER BY created_at
         LIMIT :limit
         FOR UPDATE SKIP LOCKED
    )
    UPDATE notifications n SET published_at = now()
      FROM due WHERE n.id = due.id AND n.created_at = due.created_at
    RETURNING n.id, n.tenant_id, n.channel, n.user_id, n.priority, n.traceparent
    """
)


@dataclass
class RelayStats:
    passes: int = 0
    republished: int = 0


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
    ) -> None:
        self.engine = engine
        self.publisher = publisher
        self.interval_s = interval_s
        self.grace_s = grace_s
        self.stale_queued_s = stale_queued_s
        self.batch = batch
        self.stats = RelayStats()

    @classmethod
    def from_settings(cls, engine: AsyncEngine, publisher: Publisher, settings: Settings) -> Relay:
        """The relay ``settings`` describe (its ``relay_*`` fields)."""
        return cls(
            engine,
            publisher,
            interval_s=settings.relay_interval_s,
            grace_s=settings.relay_grace_s,
            stale_queued_s=settings.relay_stale_queued_s,
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Relay]:
        """`run` in a task for the duration of the block, cancelled (and awaited) when it ends.
        The publisher and engine stay the caller's to close."""
        task = asyncio.create_task(self.run())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run_once(self) -> int:
        """One pass; returns how many notifications were republished."""
        async with self.engine.begin() as conn:
            rows = (
                await conn.execute(
                    PICK, {"grace_s": self.grace_s, "stale_s": self.stale_queued_s, "limit": self.batch}
                )
            ).all()
        if not rows:
            return 0
        acked = await republish(engine=self.engine, publisher=self.publisher, rows=rows)
        self.stats.republished += acked
        metrics.RELAY_REPUBLISHED.inc(acked)
        if acked:
            log.info("relay republished %d notifications", acked)
        return acked

    async def run(self) -> None:
        while True:
            self.stats.passes += 1
            try:
                while await self.run_once() >= self.batch:
                    pass
            except Exception:
                log.warning("relay pass failed; retrying in %.1fs", self.interval_s, exc_info=True)
            await asyncio.sleep(self.interval_s)
