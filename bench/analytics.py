"""Analytics read speed: ``GET /v1/analytics`` answered from rollups standing for 20 million
notifications over 30 days, against the same question asked of the log itself.

    .venv/bin/python -m bench.analytics [--notifications 20000000] [--log-rows 1000000]

Preloads (in SQL, on a fresh database dropped afterwards) one tenant's hourly rollups: 30 days x
24 hours x 3 channels x 100 templates x 2 versions, counts summing to ``--notifications``; and,
for the contrast, ``--log-rows`` sent notifications in the log. Then times, 20 times each, the
API's query for 30 days by day grouped by template, and the equivalent GROUP BY over the log.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime, timedelta

import asyncpg

from api.analytics import read_analytics
from api.search_limit import SearchLimit
from clarion.pg import asyncpg_dsn
from harness.services import drop_database, fresh_database
from harness.tenants import make_tenant
from schema.db import create_engine

ROLLUP_ROWS = 30 * 24 * 3 * 100 * 2

PRELOAD_ROLLUPS = """
INSERT INTO analytics_hourly (tenant_id, hour, channel, template, template_version, category, provider,
                              accepted, sent, failed, delivered, opened, clicked)
SELECT $1, date_trunc('hour', now()) - make_interval(hours => h), ch, 'template-' || t, v, 'orders',
       CASE ch WHEN 'email' THEN 'sendgrid' WHEN 'sms' THEN 'twilio' ELSE 'fcm' END,
       $2::bigint, $2::bigint - 1, 1, $2::bigint - 2, $2::bigint / 3, $2::bigint / 10
  FROM generate_series(0, 30 * 24 - 1) h, unnest(ARRAY['email', 'sms', 'push']) ch,
       generate_series(1, 100) t, generate_series(1, 2) v
"""
PRELOAD_LOG = """
INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, category, priority,
                           template, template_version, status, history, attempts, created_at, updated_at)
SELECT gen_random_uuid(), $1, 'bench-' || i, '', $2, 'email', 'orders', 'normal',
       'template-' || (i % 100), 1 + i % 2, 'sent', '[]', 1,
       now() - make_interval(secs => i % (30 * 86400)), now()
  FROM generate_series(1, $3) i
"""
NAIVE = """
SELECT date_trunc('day', created_at, 'UTC') AS at, template, count(*),
       count(*) FILTER (WHERE status = 'sent') AS sent
  FROM notifications WHERE tenant_id = $1 AND created_at >= $2 AND created_at < $3
 GROUP BY 1, 2 ORDER BY 1, 2
"""


async def timed(call: object, runs: int = 20) -> list[float]:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        await call()  # type: ignore[operator]
        times.append((time.perf_counter() - started) * 1000)
    return times


async def main(notifications: int, log_rows: int) -> None:
    url = await fresh_database("clarion_bench_analytics")
    try:
        engine = create_engine(url, pool_size=1)
        tenant = await make_tenant(engine)
        await engine.dispose()
        pool = await asyncpg.create_pool(asyncpg_dsn(url), min_size=1, max_size=2)
        assert pool is not None
        per_row = max(3, notifications // ROLLUP_ROWS)
        started = time.perf_counter()
        await pool.execute(PRELOAD_ROLLUPS, tenant.id, per_row)
        user_id = await pool.fetchval(
            "INSERT INTO users (id, tenant_id, external_id) VALUES (gen_random_uuid(), $1, 'u') RETURNING id",
            tenant.id,
        )
        await pool.execute(PRELOAD_LOG, tenant.id, user_id, log_rows)
        await pool.execute("ANALYZE")
        print(f"preloaded {ROLLUP_ROWS:,} rollup rows ({per_row * ROLLUP_ROWS:,} notifications) and "
              f"{log_rows:,} log rows in {time.perf_counter() - started:.1f} s")  # fmt: skip
        until = datetime.now(UTC)
        since = until - timedelta(days=30)

        reads = create_engine(url, pool_size=1)
        searches = SearchLimit(per_tenant=1, timeout_s=600)  # the API's gate, without its time bound

        async def rollups() -> None:
            await read_analytics(
                engine=reads,
                searches=searches,
                cursor_secret=b"bench",
                tenant_id=tenant.id,
                since=since,
                until=until,
                interval="day",
                group_by=["template"],
            )

        async def naive() -> None:
            await pool.fetch(NAIVE, tenant.id, since, until)

        for name, call in (("rollups (GET /v1/analytics), 30 days by day and template", rollups),
                           (f"GROUP BY over the log ({log_rows:,} rows)", naive)):  # fmt: skip
            ms = await timed(call)
            print(f"{name:60} p50 {statistics.median(ms):8.1f} ms  max {max(ms):8.1f} ms")
        await pool.close()
        await reads.dispose()
    finally:
        await drop_database(url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--notifications", type=int, default=20_000_000)
    parser.add_argument("--log-rows", type=int, default=1_000_000)
    args = parser.parse_args()
    asyncio.run(main(args.notifications, args.log_rows))
