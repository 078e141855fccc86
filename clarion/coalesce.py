"""Coalescing concurrent single calls into batches (group commit).

On these machines a round trip to PostgreSQL costs far more than the rows it carries, so the hot
paths that arrive one item at a time (an HTTP send, a sandbox delivery) hand their item to a
:class:`Coalescer` and await their own result. Whenever one of ``max_in_flight`` slots is free,
the coalescer runs everything waiting (up to ``max_batch``) as one batch. There is no linger
timer: a lone item on an idle process runs at once, and a busy process batches tens of items.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from clarion import metrics

T = TypeVar("T")
R = TypeVar("R")


class Abandoned(ConnectionError):
    """The batch holding this item was cancelled (the process is stopping) before it finished."""


class Coalescer(Generic[T, R]):
    """Runs ``run(items)`` for batches of concurrently submitted items.

    ``run`` returns one result per item, in order; a result that is an ``Exception`` is raised to
    that item's caller alone. If ``run`` itself raises, every caller of the batch gets the error.
    """

    def __init__(
        self,
        run: Callable[[list[T]], Awaitable[Sequence[R | Exception]]],
        *,
        max_batch: int,
        max_in_flight: int,
        name: str,
    ) -> None:
        self._run = run
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.name = name
        self._waiting: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, item: T) -> R:
        """``item``'s result once its batch has run; raises its error."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._waiting.append((item, future))
        if not self._scheduled:  # items submitted in the same loop iteration share a batch
            self._scheduled = True
            loop.call_soon(self._dispatch)
        return await future

    def _dispatch(self) -> None:
        self._scheduled = False
        while self._waiting and self._in_flight < self.max_in_flight:
            count = min(len(self._waiting), self.max_batch)
            batch = [self._waiting.popleft() for _ in range(count)]
            metrics.COALESCED_BATCH.labels(self.name).observe(count)
            self._in_flight += 1
            task = asyncio.create_task(self._settle(batch), name=self.name)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _settle(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _ in batch])
            for (_, future), result in zip(batch, results, strict=True):
                if future.done():  # its caller went away; the item's effect stands anyway
                    continue
                if isinstance(result, Exception):
                    future.set_exception(result)
                else:
                    future.set_result(result)
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            for _, future in batch:
                if not future.done():
                    future.set_exception(Abandoned(f"{self.name}: batch cancelled before it finished"))
            self._in_flight -= 1
            self._dispatch()
