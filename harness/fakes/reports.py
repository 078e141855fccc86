"""What a fake posts back to Clarion after a send: Twilio's status callbacks, SendGrid's Event
Webhook batches. Like the real services, a fake posts them from tasks of its own, after it has
answered the send; a receiver that cannot be reached is recorded, never raised."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import aiohttp


class Reports:
    """The fake's report tasks and the one HTTP session they post on."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._client: aiohttp.ClientSession | None = None

    def schedule(self, report: Coroutine[Any, Any, Any]) -> None:
        """Run ``report`` in a task of its own (kept until it ends, cancelled by ``aclose``)."""
        task = asyncio.create_task(report)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def post(self, url: str, *, data: Any, headers: dict[str, str]) -> int:
        """POST to ``url``; the status the receiver answered, or -1 when it could not be reached."""
        if self._client is None:
            self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        try:
            async with self._client.post(url, data=data, headers=headers) as response:
                return response.status
        except (aiohttp.ClientError, TimeoutError):
            return -1

    async def settled(self) -> None:
        """Return once every report scheduled so far has been posted (or failed)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel the reports still pending and close the session."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.close()
            self._client = None
