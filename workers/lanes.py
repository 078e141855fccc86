"""Strict priority of a worker's main lane over its bulk lane.

One worker process consumes both lanes of its channel, so they share one event loop, one DB
pool, one send semaphore and the machine's CPU. Left alone, a 500-record bulk batch puts
hundreds of sends ahead of an OTP that arrives a moment later. So the bulk lane takes turns: it
delivers its batch in chunks of ``chunk`` notifications and, before each chunk, waits until the
main lane has no batch in flight. An urgent send shares the worker with at most one small bulk
chunk already under way; when the main lane is quiet the bulk lane runs flat out.

Nothing is skipped or reordered across commits: the bulk handler still records every chunk and
acks its Kafka batch only after the last one. A chunk waits at most ``max_wait_s`` for its turn,
so a main lane that is never idle slows the bulk lane to one chunk per ``max_wait_s`` rather
than stopping it, and the bulk consumer keeps polling well within Kafka's ``max.poll.interval``
(no rebalance).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


class LanePriority:
    """Main lane first: ``urgent()`` marks main-lane work in flight, ``bulk_turn()`` waits for none."""

    def __init__(self, *, chunk: int, max_wait_s: float) -> None:
        if chunk < 1:
            raise ValueError("chunk must be at least 1")
        self.chunk = chunk
        self.max_wait_s = max_wait_s
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._bulk_waiting = 0
        self.waited_s = 0.0  # total time bulk chunks spent waiting for their turn
        self.overridden = 0  # chunks that went ahead after max_wait_s with main-lane work in flight

    @property
    def main_in_flight(self) -> int:
        """Main-lane batches being delivered right now."""
        return self._in_flight

    @property
    def bulk_waiting(self) -> int:
        """Bulk chunks waiting for their turn right now."""
        return self._bulk_waiting

    @contextlib.asynccontextmanager
    async def urgent(self) -> AsyncIterator[None]:
        """Hold bulk chunks back while the block runs (main-lane batches may overlap)."""
        self._in_flight += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def bulk_turn(self) -> None:
        """Return once the main lane has nothing in flight, or after ``max_wait_s`` regardless."""
        if self._idle.is_set():
            return
        started = asyncio.get_running_loop().time()
        self._bulk_waiting += 1
        try:
            await asyncio.wait_for(self._idle.wait(), self.max_wait_s)
        except TimeoutError:
            self.overridden += 1
        finally:
            self._bulk_waiting -= 1
            self.waited_s += asyncio.get_running_loop().time() - started

    def chunks(self, items: Sequence[T]) -> Iterator[list[T]]:
        """``items`` in order, ``chunk`` at a time."""
        for start in range(0, len(items), self.chunk):
            yield list(items[start : start + self.chunk])
