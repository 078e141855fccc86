"""Does one tenant reading its whole analytics range slow another tenant's sends?

    .venv/bin/python -m bench.analytics_fairness [--seconds 15] [--rounds 2] [--loops 2]

Starts its own Tansu broker, a fresh database (dropped afterwards) and ``clarion api`` as a
separate process. Tenant A holds 30 days of hourly rollups for 13 templates, so ``GET
/v1/analytics`` hourly by channel and template over those 30 days is 9,360 rows, just under the
10,000 one answer held before paging. Tenant B sends one notification at a time, 10 ms apart,
and each accept's latency is kept.

Each round has two phases of ``--seconds``: B alone, then B while ``--loops`` clients of A read
the whole range again and again (each read follows ``next_cursor`` to the last page; an API
without paging answers in one page). ``--loops`` defaults to the tenant's search share (2), so no
read is refused. Printed: B's accept p50/p99/max in each phase, pooled over the rounds, and A's
reads, pages, rows and megabytes. Last, A reads the whole range ``--reads`` times alone, one read
at a time, and the API process's CPU per read and per page is printed (``--limit`` sets the page
size; by default the API's).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import aiohttp
import asyncpg

from bench.lone_api import lone_api, paced_accepts, quantile
from bench.procfs import cpu_s
from clarion.pg import asyncpg_dsn
from harness.tenants import make_tenant

HOURS = 30 * 24
TEMPLATES = 13
PRELOAD = """
INSERT INTO analytics_hourly (tenant_id, hour, channel, template, template_version, category, provider,
                              accepted, sent, failed, delivered, opened, clicked)
SELECT $1, date_trunc('hour', now()) - make_interval(hours => h), 'email', 'template-' || t, 1, 'orders',
       'sendgrid', 1000, 990, 10, 980, 300, 90
  FROM generate_series(0, $2 - 1) h, generate_series(1, $3) t
"""


NEXT_CURSOR = re.compile(rb'"next_cursor":"([^"]+)"')


@dataclass
class Reads:
    reads: int = 0
    pages: int = 0
    rows: int = 0
    bytes: int = 0
    statuses: Counter[int] = field(default_factory=Counter)


async def accepts(session: aiohttp.ClientSession, url: str, key: str, seconds: float) -> list[float]:
    """Tenant B's sends, one at a time: the latency of each, in ms."""
    latencies, refused = await paced_accepts(session, url=url, key=key, seconds=seconds)
    assert refused == 0, f"{refused} of B's sends refused"
    return latencies


async def read_whole(
    session: aiohttp.ClientSession, url: str, key: str, params: dict[str, str], out: Reads
) -> None:
    """Tenant A reading the whole range once, following ``next_cursor`` to the last page."""
    cursor: str | None = None
    while True:
        query = params | ({"cursor": cursor} if cursor else {})
        async with session.get(
            f"{url}/v1/analytics", params=query, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            raw = await r.read()
            out.statuses[r.status] += 1
            if r.status != 200:
                await asyncio.sleep(0.05)
                return
        # Not parsed: decoding A's pages in this process would delay the timing of B's sends.
        out.pages += 1
        out.rows += raw.count(b'"counts":')
        out.bytes += len(raw)
        found = NEXT_CURSOR.search(raw, max(0, len(raw) - 4000))
        cursor = found.group(1).decode() if found else None
        if not cursor:
            out.reads += 1
            return


async def read_loop(
    session: aiohttp.ClientSession,
    url: str,
    key: str,
    params: dict[str, str],
    stop: asyncio.Event,
    out: Reads,
) -> None:
    while not stop.is_set():
        await read_whole(session, url, key, params, out)


def report(title: str, ms: list[float]) -> None:
    print(
        f"{title:40s} {len(ms):6d} sends  p50 {quantile(ms, 0.5):6.1f} ms  "
        f"p99 {quantile(ms, 0.99):6.1f} ms  max {max(ms):7.1f} ms"
    )


async def main(seconds: float, rounds: int, loops: int, reads_alone: int, limit: int | None) -> None:
    async with lone_api("clarion_bench_fairness") as api:
        reader, sender = await make_tenant(api.engine), await make_tenant(api.engine)
        conn = await asyncpg.connect(asyncpg_dsn(api.database_url))
        await conn.execute(PRELOAD, reader.id, HOURS, TEMPLATES)
        await conn.execute("ANALYZE analytics_hourly")
        await conn.close()
        until = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        params = {
            "interval": "hour",
            "group_by": "channel,template",
            "since": (until - timedelta(hours=HOURS)).isoformat(),
            "until": until.isoformat(),
        } | ({"limit": str(limit)} if limit else {})
        alone: list[float] = []
        loaded: list[float] = []
        reads = Reads()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=loops + 4)) as session:
            await accepts(session, api.url, sender.key, 1.0)  # warm up
            for _ in range(rounds):
                alone += await accepts(session, api.url, sender.key, seconds)
                stop = asyncio.Event()
                readers = [
                    asyncio.create_task(read_loop(session, api.url, reader.key, params, stop, reads))
                    for _ in range(loops)
                ]
                loaded += await accepts(session, api.url, sender.key, seconds)
                stop.set()
                await asyncio.gather(*readers)
            alone_reads = Reads()
            started_cpu_s, started = cpu_s(api.pid), time.monotonic()
            for _ in range(reads_alone):
                await read_whole(session, api.url, reader.key, params, alone_reads)
            spent_cpu_ms = (cpu_s(api.pid) - started_cpu_s) * 1000
            wall_ms = (time.monotonic() - started) * 1000
        report("B's accepts, alone", alone)
        report(f"B's accepts, {loops} loops of A's reads", loaded)
        print(
            f"A: {reads.reads} whole reads, {reads.pages} pages, {reads.rows:,} rows, "
            f"{reads.bytes / 1e6:.1f} MB; statuses {dict(reads.statuses)}"
        )
        n = max(1, alone_reads.reads)
        print(
            f"A alone: {alone_reads.reads} reads of {alone_reads.pages // n} pages; API CPU per read "
            f"{spent_cpu_ms / n:.1f} ms, per page {spent_cpu_ms / max(1, alone_reads.pages):.1f} ms; "
            f"wall per read {wall_ms / n:.1f} ms"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loops", type=int, default=2)
    parser.add_argument("--reads", type=int, default=20)
    parser.add_argument("--limit", type=int, default=None)
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.rounds, args.loops, args.reads, args.limit))
