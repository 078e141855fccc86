"""The load a benchmark puts on an API: wrk (``bench/wrk_load.py``) or a Python client, and what
it measured."""

from __future__ import annotations

import asyncio
import json
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class Load:
    """What a load generator measured: sends accepted, how long it took, accept latency, and the
    sends refused (only a driver told to carry on past a refusal counts any)."""

    sent: int
    elapsed_s: float
    p50_s: float
    p99_s: float
    refused: int = 0


Driver = Callable[[], Awaitable[Load]]


def body(i: int, channel: str) -> dict[str, object]:
    user = {"id": f"u-{i % 5000}", "email": f"user{i % 5000}@example.com", "phone": "+14155550100"}
    template, data = ("otp", {"code": str(i)}) if channel == "sms" else ("welcome", {"name": f"n{i}"})
    return {
        "event_id": f"bench-{secrets.token_hex(8)}",
        "user": user,
        "channel": channel,
        "template": template,
        "data": data,
    }


async def drive(url: str, key: str, count: int, concurrency: int, channel: str, batch: int = 1) -> Load:
    """Send ``count`` notifications from ``concurrency`` aiohttp clients in this process, one per
    request (``batch`` 1) or ``batch`` per ``POST /v1/notifications/batch``."""
    latencies: list[float] = []
    next_i = 0
    headers = {"Authorization": f"Bearer {key}"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(url, headers=headers, connector=connector) as session:

        async def client() -> None:
            nonlocal next_i
            while next_i < count:
                i = next_i
                size = min(batch, count - i)
                next_i += size
                if batch == 1:
                    path, payload = "/v1/notifications", body(i, channel)
                else:
                    path = "/v1/notifications/batch"
                    payload = {"notifications": [body(j, channel) for j in range(i, i + size)]}
                t0 = time.perf_counter()
                async with session.post(path, json=payload) as response:
                    answer = await response.read()
                    if response.status != 202 or (batch > 1 and json.loads(answer)["rejected"]):
                        raise RuntimeError(f"send {i}: HTTP {response.status} {answer[:200]!r}")
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=100)
    return Load(count, elapsed, q[49], q[98])


@dataclass(frozen=True)
class LoadPlan:
    """How to load an API: ``wrk`` for ``seconds`` (the default, see ``bench/wrk_load.py``), or
    ``count`` sends from this process's aiohttp client (``python``, the only one that batches)."""

    load: str
    count: int
    seconds: float
    concurrency: int
    channel: str = "email"
    batch: int = 1

    def driver(self, url: str, key: str) -> Driver:
        if self.load == "wrk" and self.batch == 1:
            from bench.wrk_load import wrk_drive

            return lambda: wrk_drive(url, key, self.seconds, self.concurrency, self.channel)
        return lambda: drive(url, key, self.count, self.concurrency, self.channel, self.batch)

    def warm_up(self, url: str, key: str) -> Driver:
        return lambda: drive(url, key, 200, 16, self.channel)

    def describe(self) -> str:
        if self.load == "wrk" and self.batch == 1:
            return f"wrk, {self.seconds:g} s"
        return f"python client, {self.count} sends" + (f", {self.batch} a request" if self.batch > 1 else "")
