"""Do sends wait while the upkeep creates a day partition ahead? Insert latency around each create.

    .venv/bin/python -m bench.partition_create [--senders 8] [--creates 5] [--reader-hold-ms 150]

On a fresh, migrated database: ``--senders`` connections insert into ``notifications`` one
transaction after another (each held 5 ms, the rest of an accept), and one reader lists the last
hour of a tenant's notifications in transactions held ``--reader-hold-ms`` (a dashboard, a
search: bounded by time, so pruned to today's partition). Once a second, the relay's
``schema.partitions.ensure_ahead`` creates one more day ahead. It prints how long each create
took and the slowest insert that started during one, against the p99 and the slowest of the
inserts 0.3 s or more away from any.

A create that takes ACCESS EXCLUSIVE on the parent (``CREATE TABLE ... PARTITION OF``, Clarion's
until 2026-11-28) waits for the reader's transaction and stops every insert while it waits: the
first figure rises to the reader's hold. ``ATTACH PARTITION`` takes SHARE UPDATE EXCLUSIVE on the
parent: both figures stay at the run's own p99 (README, "Benchmarks").
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import time

import asyncpg

from bench.growth_drop import Latency, Sample
from clarion.pg import asyncpg_dsn
from harness.services import drop_database, fresh_database
from schema import partitions

INSERT = (
    "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, data)"
    " VALUES (gen_random_uuid(), 't', $1, 'x', $2, 'push', '{}')"
)
AWAY_S = 0.3  # an insert this far from every create is "away" from them
LISTING = "SELECT count(*) FROM notifications WHERE tenant_id = 't' AND created_at BETWEEN $1 AND $2"


async def _sender(dsn: str, k: int, user: object, stop: asyncio.Event, out: list[Sample]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        i = 0
        while not stop.is_set():
            i += 1
            started = time.perf_counter()
            async with conn.transaction():
                await conn.execute(INSERT, f"{k}-{i}", user)
                await asyncio.sleep(0.005)  # the rest of an accept transaction
            out.append(Sample(started, time.perf_counter() - started, accepted=True))
    finally:
        await conn.close()


async def _reader(dsn: str, hold_s: float, stop: asyncio.Event) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SET plan_cache_mode = force_custom_plan")  # as Clarion's pools do
        while not stop.is_set():
            async with conn.transaction():
                now = dt.datetime.now(dt.UTC)
                await conn.fetchval(LISTING, now - dt.timedelta(hours=1), now)
                await asyncio.sleep(hold_s)
    finally:
        await conn.close()


async def run(*, senders: int, creates: int, reader_hold_ms: float) -> None:
    url = await fresh_database("clarion_bench_create")
    dsn = asyncpg_dsn(url)
    upkeep = await asyncpg.connect(dsn)
    try:
        await upkeep.execute("INSERT INTO tenants (id, name) VALUES ('t', 't')")
        user = await upkeep.fetchval(
            "INSERT INTO users (id, tenant_id, external_id) VALUES (gen_random_uuid(), 't', 'u') RETURNING id"
        )
        today = dt.datetime.now(dt.UTC).date()
        await partitions.ensure_ahead(upkeep, parent="notifications", today=today, days_ahead=0)
        stop = asyncio.Event()
        samples: list[Sample] = []
        tasks = [asyncio.create_task(_sender(dsn, k, user, stop, samples)) for k in range(senders)]
        tasks.append(asyncio.create_task(_reader(dsn, reader_hold_ms / 1000, stop)))
        spans = []
        for n in range(1, creates + 1):
            await asyncio.sleep(1.0)
            started = time.perf_counter()
            day = today + dt.timedelta(days=10 * n)
            await partitions.ensure_ahead(upkeep, parent="notifications", today=day, days_ahead=0)
            spans.append((started, time.perf_counter()))
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        await upkeep.close()
        await drop_database(url)
    during = Latency.of([s for s in samples if any(a <= s.at_s <= b for a, b in spans)])
    away = Latency.of([s for s in samples if all(not a - AWAY_S <= s.at_s <= b + AWAY_S for a, b in spans)])
    print(f"creates (ms):                          {', '.join(f'{(b - a) * 1000:.1f}' for a, b in spans)}")
    print(f"slowest insert started during a create: {during.max_s * 1000:.1f} ms ({during.count})")
    print(
        f"inserts away from any create:           p99 {away.p99_s * 1000:.1f} ms,"
        f" slowest {away.max_s * 1000:.1f} ms ({away.count})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--creates", type=int, default=5)
    parser.add_argument("--reader-hold-ms", type=float, default=150.0)
    args = parser.parse_args()
    asyncio.run(run(senders=args.senders, creates=args.creates, reader_hold_ms=args.reader_hold_ms))


if __name__ == "__main__":
    main()
