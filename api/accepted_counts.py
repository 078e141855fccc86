"""The ``accepted`` analytics rollups, added up in memory and written once a second.

Each accept transaction's sends used to be counted by an upsert of their rollup rows right after
the commit: one more round trip per shared transaction, every one of them updating the same hot
rows (one tenant, one hour, one template). Measured on ``bench.e2e``'s wrk load (py-spy on the API,
``pg_stat_statements``, 2026-11-26): ~4% of the API's CPU and ~80 us of PostgreSQL's time per
notification, for a count nobody reads within the second. Now the API process adds its sends'
keys to a counter and writes it with one upsert every ``interval_s``, and once more when it stops.

What it keeps: the counts were already written after the commit and best effort ("a crash between
the two loses those counts: the rollup is a view for people, the log is the record",
``core.analytics``); a crash now loses up to ``interval_s`` of them instead of one transaction's.
A write that fails is retried at the next interval, up to ``MAX_KEYS`` distinct rollup rows held
(then the oldest are let go, with a warning): a database down for long costs counts, not memory.

Errors: none raised; a failed write is logged and retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Iterable

import asyncpg

from core.analytics import RollupKey, add_many

log = logging.getLogger(__name__)

MAX_KEYS = 10_000  # distinct (tenant, hour, channel, template, version, category) rows held


class AcceptedCounts:
    """Accepted sends counted per rollup row, written every ``interval_s`` (see module docstring)."""

    def __init__(self, *, pool: asyncpg.Pool, interval_s: float = 1.0) -> None:
        self._pool = pool
        self._interval_s = interval_s
        self._pending: Counter[RollupKey] = Counter()
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def add(self, keys: Iterable[RollupKey]) -> None:
        """Count one accepted send per key (a key once per send)."""
        self._pending.update(keys)

    @property
    def pending(self) -> int:
        """Sends counted and not yet written."""
        return sum(self._pending.values())

    def start(self) -> None:
        if self._task is None:
            self._stop.clear()
            self._task = asyncio.create_task(self._run(), name="clarion-accepted-counts")

    async def _run(self) -> None:
        """Write every ``interval_s`` until stopped, then once more: a write is never cut off."""
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Write what is counted so far; on failure keep it for the next try."""
        taken, self._pending = self._pending, Counter()
        if not taken:
            return
        try:
            await add_many(
                conn=self._pool, counts={key: Counter({"accepted": n}) for key, n in taken.items()}
            )
        except Exception as exc:  # the log is the record; the rollup is a view of it
            log.warning(
                "accepted analytics not written for %d sends yet (%s)", taken.total(), type(exc).__name__
            )
            taken.update(self._pending)
            if len(taken) > MAX_KEYS:
                dropped = sorted(taken, key=lambda k: k.hour)[: len(taken) - MAX_KEYS]
                log.warning("accepted analytics let go for %d rollup rows", len(dropped))
                for key in dropped:
                    del taken[key]
            self._pending = taken

    async def aclose(self) -> None:
        """Stop the timer and write what is left (the API's shutdown)."""
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None
        else:
            await self.flush()
