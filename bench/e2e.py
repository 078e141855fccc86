"""End-to-end benchmark: accepts/s through POST /v1/notifications, deliveries/s to the sandbox
provider, and accept latency, with the API, an email worker and the relay as separate processes.

    .venv/bin/python -m bench.e2e [--count 10000] [--concurrency 64] [--channel email] [--batch N]

It starts its own Tansu broker and a fresh database (dropped afterwards).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import time
from pathlib import Path

import aiohttp
import asyncpg

from clarion.broker import TansuBroker, free_port
from clarion.kafka import create_topics
from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from schema.db import create_engine
from tests.conftest import make_tenant
from tests.fixtures.services import ClarionProcess, drop_database, fresh_database, wait_until


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


async def drive(
    url: str, key: str, count: int, concurrency: int, channel: str, batch: int = 1
) -> tuple[float, list[float]]:
    """Send ``count`` notifications from ``concurrency`` clients, one per request (``batch`` 1) or
    ``batch`` per ``POST /v1/notifications/batch``; returns the elapsed seconds and each request's
    latency."""
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
        return time.perf_counter() - start, latencies


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main(count: int, concurrency: int, channel: str, workers: int, batch: int) -> None:
    broker = TansuBroker()
    broker.start()
    url = await fresh_database("clarion_bench")
    procs: list[ClarionProcess] = []
    try:
        await create_topics(broker.bootstrap, partitions=4)
        settings = Settings(
            database_url=url,
            kafka_bootstrap=broker.bootstrap,
            api_port=free_port(),
            env="test",
            db_pool_size=20,
        )
        engine = create_engine(url, pool_size=1)
        tenant = await make_tenant(engine)
        await engine.dispose()
        procs = [ClarionProcess(settings, "api"), ClarionProcess(settings, "relay")]
        procs += [ClarionProcess(settings, "worker", channel) for _ in range(workers)]
        for p in procs:
            p.start()
        api_url = f"http://127.0.0.1:{settings.api_port}"
        conn = await asyncpg.connect(asyncpg_dsn(url))

        async def api_up() -> bool:
            try:
                async with aiohttp.ClientSession() as s, s.get(f"{api_url}/readyz") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(api_up, 30)
        await drive(api_url, tenant.key, 200, 16, channel)  # warm-up; also lets the workers join
        await wait_until(lambda: _count(conn, "sent", 200), 60)
        base = await conn.fetchval("SELECT count(*) FROM notifications")
        pids = {f"{i} {' '.join(p.args)}": p.pid for i, p in enumerate(procs)}
        cpu_before = {name: cpu_s(pid) for name, pid in pids.items()}
        start = time.perf_counter()
        elapsed, latencies = await drive(api_url, tenant.key, count, concurrency, channel, batch)
        await wait_until(lambda: _count(conn, "sent", base + count), 600, 0.05)
        delivered_s = time.perf_counter() - start
        cpu_ms = {name: (cpu_s(pid) - cpu_before[name]) * 1000 / count for name, pid in pids.items()}
        await conn.close()
        q = statistics.quantiles(latencies, n=100)
        print(
            f"\nClarion end to end, {count} {channel} notifications, {concurrency} concurrent clients, "
            f"{workers} worker process(es), API + relay as separate processes\n"
        )
        route = "POST /v1/notifications" + ("" if batch == 1 else f"/batch, {batch} a request")
        print(f"{'accepted/s (' + route + ')':40} {count / elapsed:10.0f}")
        print(f"{'accept latency p50 (ms)':40} {q[49] * 1000:10.1f}")
        print(f"{'accept latency p99 (ms)':40} {q[98] * 1000:10.1f}")
        print(f"{'delivered/s end to end (to sent)':40} {count / delivered_s:10.0f}")
        print(f"{'time to last sent after first send (s)':40} {delivered_s:10.2f}")
        for name, ms in cpu_ms.items():
            print(f"{'CPU ms per notification, ' + name:40} {ms:10.3f}")
    finally:
        for p in procs:
            p.stop(10)
        broker.stop()
        await drop_database(url)


async def _count(conn: asyncpg.Connection, status: str, at_least: int) -> bool:
    return (
        int(await conn.fetchval("SELECT count(*) FROM notifications WHERE status = $1", status)) >= at_least
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--channel", default="email", choices=["email", "sms"])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--batch", type=int, default=1, help="notifications per request (>1: POST /v1/notifications/batch)"
    )
    args = parser.parse_args()
    asyncio.run(main(args.count, args.concurrency, args.channel, args.workers, args.batch))
