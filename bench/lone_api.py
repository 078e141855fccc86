"""One ``clarion api`` process on a database and a Tansu broker of its own, for the benchmarks that
load the API alone (``bench.hostile_render``, ``bench.analytics_fairness``,
``bench.anonymous_flood``): started, ready (``/readyz``), and torn down with its database; and
what they measure on it: a tenant's paced sends (``paced_accepts``) and their quantiles.

    async with lone_api("clarion_bench_x") as api:
        tenant = await make_tenant(api.engine)
        ... load api.url ...
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.broker import TansuBroker
from clarion.kafka import create_topics
from clarion.ports import free_port
from clarion.settings import Settings
from harness.services import ClarionProcess, drop_database, fresh_database, wait_until
from schema.db import create_engine


@dataclass(frozen=True)
class LoneApi:
    settings: Settings
    database_url: str
    url: str  # the API's base URL
    pid: int  # the API process, for its CPU (``bench.procfs.cpu_s``)
    engine: AsyncEngine  # one connection to the database, for the benchmark's own set-up


@asynccontextmanager
async def lone_api(
    database_prefix: str, *, extra_env: dict[str, str] | None = None
) -> AsyncIterator[LoneApi]:
    """The API up and answering ``/readyz`` (``extra_env`` added to its environment, e.g. provider
    secrets); everything stopped and the database dropped after."""
    broker = TansuBroker()
    broker.start()
    url = await fresh_database(database_prefix)
    api: ClarionProcess | None = None
    engine = create_engine(url, pool_size=1)
    try:
        await create_topics(broker.bootstrap, partitions=2)
        settings = Settings(
            database_url=url, kafka_bootstrap=broker.bootstrap, api_port=free_port(), env="test"
        )
        api = ClarionProcess(settings, "api", extra_env=extra_env)
        api.start()
        api_url = f"http://127.0.0.1:{settings.api_port}"

        async def up() -> bool:
            try:
                async with aiohttp.ClientSession() as s, s.get(f"{api_url}/readyz") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(up, 60, 0.2)
        yield LoneApi(settings=settings, database_url=url, url=api_url, pid=api.pid, engine=engine)
    finally:
        await engine.dispose()
        if api is not None:
            api.stop(10)
        broker.stop()
        await drop_database(url)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def paced_accepts(
    session: aiohttp.ClientSession, *, url: str, key: str, seconds: float, loops: int = 1
) -> tuple[list[float], int]:
    """A tenant's email sends for ``seconds``, ``loops`` of them each sending one at a time 10 ms
    apart: the latency of each (ms), and how many were refused (not 202)."""
    latencies: list[float] = []
    refused = 0

    async def one_loop(n: int) -> None:
        nonlocal refused
        end, i = time.monotonic() + seconds, 0
        while time.monotonic() < end:
            body = {
                "event_id": f"probe-{n}-{i}-{secrets.token_hex(4)}",
                "user": {"id": f"probe-{i % 50}", "email": f"probe{i % 50}@example.com"},
                "channel": "email",
                "content": {"subject": "Your order", "body": "Shipped."},
            }
            started = time.monotonic()
            async with session.post(
                f"{url}/v1/notifications", json=body, headers={"Authorization": f"Bearer {key}"}
            ) as r:
                await r.read()
                refused += r.status != 202
            latencies.append((time.monotonic() - started) * 1000)
            i += 1
            await asyncio.sleep(0.01)

    await asyncio.gather(*(one_loop(n) for n in range(loops)))
    return latencies, refused
