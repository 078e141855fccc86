"""A background task for the length of a block: started on entry, cancelled and awaited on exit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


@contextlib.asynccontextmanager
async def running(coro: Coroutine[Any, Any, T], *, name: str | None = None) -> AsyncIterator[asyncio.Task[T]]:
    """Run ``coro`` in a task while the block runs; on exit cancel it and wait until it has
    stopped (its own ``finally`` clauses done), so nothing it holds outlives the block."""
    task = asyncio.create_task(coro, name=name)
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
