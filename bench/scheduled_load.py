"""The two clients of ``bench.scheduled_release``: tenant A banking sends for one instant at its
rule's rate, and tenant B's steady immediate sends."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from uuid import UUID

import aiohttp

from bench.load import body


async def bank(url: str, key: str, n: int, *, due_at: dt.datetime, rate: float, batch: int) -> int:
    """Accept ``n`` sends due at ``due_at``, ``batch`` a request on a schedule at ``rate`` a second;
    a 429 is waited out for its Retry-After, then the batch is sent again. Returns the 429s."""
    refused = sent = 0
    send_at = due_at.isoformat()
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {key}"}) as session:
        t0 = time.perf_counter()
        while sent < n:
            await asyncio.sleep(max(0.0, t0 + sent / rate - time.perf_counter()))
            size = min(batch, n - sent)
            items = [{**body(sent + j, "email"), "send_at": send_at} for j in range(size)]
            async with session.post("/v1/notifications/batch", json={"notifications": items}) as r:
                answer = await r.json()
                retry_after = r.headers.get("Retry-After")
            if r.status == 429 and retry_after is not None:
                refused += 1
                await asyncio.sleep(float(retry_after))
                continue
            if r.status != 202 or answer["accepted"] != size:
                raise RuntimeError(f"banking: HTTP {r.status} {str(answer)[:300]}")
            sent += size
    return refused


async def steady(url: str, key: str, *, rate: float, stop: asyncio.Event) -> tuple[list[UUID], int]:
    """One immediate send every 1/``rate`` s (each in a task of its own, so a slow answer does not
    delay the next) until ``stop``; the ids accepted, and how many were refused."""
    ids: list[UUID] = []
    refused = 0
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {key}"}) as session:

        async def one(i: int) -> None:
            nonlocal refused
            async with session.post("/v1/notifications", json=body(i, "email")) as r:
                answer = await r.json()
            if r.status == 202:
                ids.append(UUID(answer["id"]))
            else:
                refused += 1

        tasks: list[asyncio.Task[None]] = []
        t0 = time.perf_counter()
        while not stop.is_set():
            tasks.append(asyncio.create_task(one(len(tasks))))
            await asyncio.sleep(max(0.0, t0 + len(tasks) / rate - time.perf_counter()))
        await asyncio.gather(*tasks)
    return ids, refused
