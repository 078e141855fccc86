"""Recording a batch's outcomes while the batch is still being delivered.

A worker holds a Kafka batch (up to ``CLARION_WORKER_BATCH_SIZE``, 500) until every notification
in it has an outcome. Recorded only at the end, every provider call the batch had made so far was
lost with a worker killed before that end: its claims stayed ``sending`` until their lease expired
and were then sent again. The chaos worker-crash scenario (``python -m chaos crash``, SIGKILLs
under a backlog of full batches, 2026-11-29) counted 305, 315 and 70 such duplicates of 20,000
(8, 11 and 17 kills), each a clump of the calls made in the last ~0.1-0.3 s before a kill.

``Recording`` takes each outcome as it comes and records what has come every ``every_s`` (at
once after a record that took longer; and what is left at the end), one ``record`` transaction
each, retried until done (``until_done``): a worker killed mid-batch now loses at most the
outcomes of its last ``every_s``, of the record in progress and of the calls in flight. A batch
delivered within ``every_s`` is still one record: the extra statements come only with slow or
large batches, at most one per ``every_s`` per lane. ``bench.e2e --seconds 20``
(2026-11-29, alternated, a shared machine) with 50 ms against recording at the batch's end: a
provider call's time unrecorded p99 71 / 65 ms against 147 / 168 ms (p50 13 / 12 against 13 /
18 ms), worker CPU per notification 0.303 / 0.342 against 0.307 / 0.356 ms, PostgreSQL 0.315 /
0.400 against 0.310 / 0.465 ms: within those runs' spread. Against the tree before it, old / new /
new / old at 11:14 on a quiet machine, the worker's CPU was 0.294 / 0.303 / 0.303 / 0.294 ms a
notification: about 3%, the timer task of every batch and its extra records.

Guarantees kept:

- the batch's offsets are committed only after every outcome is recorded: ``__aexit__`` returns
  once the last one is; a block ended by an exception (a cancelled batch) records what it reached
  if it can within ``CANCELLED_WAIT_S``, and never holds up the worker's stop longer;
- records never overlap: one at a time, in the order the outcomes came;
- the same outcome is never recorded twice (``RECORD`` moves only ``sending`` rows anyway).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from types import TracebackType

from workers.outcome import Outcome
from workers.record import until_done

log = logging.getLogger(__name__)
CANCELLED_WAIT_S = 5.0


class Recording:
    """Collects a batch's outcomes (``add``) and records them every ``every_s`` and at the end.

    ``outcomes`` is every outcome added, in order: what the batch's forwarding reads."""

    def __init__(self, *, record: Callable[[list[Outcome]], Awaitable[None]], every_s: float) -> None:
        self._record = record
        self._every_s = every_s
        self._pending: list[Outcome] = []
        self._writing = asyncio.Lock()
        self._ticker: asyncio.Task[None] | None = None
        self._flush: asyncio.Task[None] | None = None
        self.outcomes: list[Outcome] = []

    def add(self, outcome: Outcome) -> None:
        self._pending.append(outcome)
        self.outcomes.append(outcome)

    async def __aenter__(self) -> Recording:
        self._ticker = asyncio.create_task(self._tick())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._ticker is not None
        self._ticker.cancel()  # a record in progress is not cancelled with it: it is shielded
        if kind is None:  # the batch is done: its offsets wait for every outcome, however long
            await self._last()
            return
        # The batch was cancelled (the worker stopping past FastStream's grace, which then closes
        # the pool without waiting for it) or failed: what it reached is recorded if that can be
        # done within CANCELLED_WAIT_S, never holding up the stop; the rest is sent again after
        # the lease, as every outcome was before outcomes were recorded as they came.
        try:
            async with asyncio.timeout(CANCELLED_WAIT_S):
                await self._last()
        except Exception as error:  # TimeoutError, or the pool closed under it
            log.warning(
                "a stopped batch's last outcomes were not recorded (%s): they are sent again after the lease",
                type(error).__name__,
            )

    async def _last(self) -> None:
        if self._flush is not None:
            await self._flush
        await self._write()

    async def _tick(self) -> None:
        # Records start every_s apart, or at once after one that took longer: what came during a
        # long record (a 500-outcome one, in a backlog) is not left waiting every_s more.
        loop = asyncio.get_running_loop()
        due = loop.time() + self._every_s
        while True:
            await asyncio.sleep(max(0.0, due - loop.time()))
            due = loop.time() + self._every_s
            if self._pending:
                self._flush = asyncio.create_task(self._write())
                await asyncio.shield(self._flush)

    async def _write(self) -> None:
        async with self._writing:
            taken, self._pending = self._pending, []
            if taken:
                await until_done("recorded", lambda: self._record(taken))
