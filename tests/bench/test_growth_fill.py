"""``bench.growth``'s fill on a small N: the rows land where the benchmark says they do (30 daily
partitions before today, the statuses and attempts of its docstring, ids carrying their time).
Not timed: the benchmark itself measures, this only checks what it measures on."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import asyncpg
import pytest

from bench.growth_fill import DAYS, fill
from clarion.log_maintenance import utc_today
from clarion.pg import asyncpg_dsn
from harness.services import drop_database, fresh_database
from schema.ids import uuid7_time
from schema.partitions import existing_ranges

ROWS = 3_000  # 100 a day: every status's share comes out exact


@pytest.fixture
async def conn() -> AsyncIterator[asyncpg.Connection]:
    url = await fresh_database("clarion_growth_fill")
    connection = await asyncpg.connect(asyncpg_dsn(url))
    await connection.execute("INSERT INTO tenants (id, name) VALUES ('t', 't')")
    try:
        yield connection
    finally:
        await connection.close()
        await drop_database(url)


async def test_fill_spreads_n_notifications_over_the_30_days_before_today(conn: asyncpg.Connection) -> None:
    today = utc_today()
    filled = await fill(conn, tenant_id="t", rows=ROWS, today=today)

    month = [today - dt.timedelta(days=DAYS - i) for i in range(DAYS)]
    assert filled.days == month and filled.rows == ROWS and filled.log_bytes > 0
    per_day = await conn.fetch(
        "SELECT tableoid::regclass::text AS part, count(*) AS n FROM notifications GROUP BY 1 ORDER BY 1"
    )
    assert [(r["part"], r["n"]) for r in per_day] == [(f"notifications_p{d:%Y%m%d}", 100) for d in month]
    for table in (
        "notifications",
        "notification_keys",
        "delivery_attempts",
        "sandbox_messages",
        "engagement",
    ):
        ranges = [days for _, days in await existing_ranges(conn, parent=table)]
        assert set(month) <= {day for days in ranges for day in days.days()}, table
        # A day a partition, but the keys' by the week, as the upkeep makes them (the last week
        # cut short by the migration's daily partition of today).
        past = [days for days in ranges if days.start < today]
        if table == "notification_keys":
            assert len(past) <= 6 and all((d.end - d.start).days <= 7 for d in past), past
        else:
            assert {(d.end - d.start).days for d in past} == {1}, table


async def test_fill_writes_statuses_attempts_keys_and_engagement_as_the_pipeline_would(
    conn: asyncpg.Connection,
) -> None:
    await fill(conn, tenant_id="t", rows=ROWS, today=utc_today())

    statuses = dict(await conn.fetch("SELECT status, count(*) FROM notifications GROUP BY 1"))
    assert statuses == {"sent": 2_850, "failed": 60, "suppressed": 90}
    outcomes = dict(await conn.fetch("SELECT outcome, count(*) FROM delivery_attempts GROUP BY 1"))
    retried = await conn.fetchval("SELECT count(*) FROM notifications WHERE status = 'sent' AND attempts = 2")
    assert retried > 0
    assert outcomes == {"sent": 2_850, "permanent": 60, "transient": 60 + retried}
    assert (
        await conn.fetchval(
            "SELECT count(*) FROM notifications n JOIN notification_keys k"
            " ON k.notification_id = n.id AND k.event_id = n.event_id AND k.day = (n.created_at AT TIME ZONE 'UTC')::date"
        )
        == ROWS
    )
    delivered = await conn.fetchval("SELECT count(*) FROM engagement WHERE type = 'delivered'")
    assert 0.15 * 2_850 < delivered < 0.35 * 2_850
    suppressed = "SELECT count(*) FROM notifications WHERE status = 'suppressed' AND error_code = 'opted_out'"
    assert await conn.fetchval(f"{suppressed} AND attempts = 0") == 90
    for row in await conn.fetch("SELECT id, created_at FROM notifications ORDER BY random() LIMIT 50"):
        assert abs(uuid7_time(row["id"]) - row["created_at"]) < dt.timedelta(milliseconds=1)
    # bench.load's users (u-0 .. u-4999), 100 of them used by each day's 100 notifications
    assert await conn.fetchval("SELECT count(*) FROM users WHERE tenant_id = 't'") == 5_000
    assert await conn.fetchval("SELECT count(DISTINCT user_id) FROM notifications") == 100
