"""The log's upkeep on the real schema: tomorrow's partitions exist before midnight, a send either
side of it lands in its own day, retention drops whole days but never one holding a live send."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from collections.abc import AsyncIterator

import asyncpg
import pytest

from clarion.log_maintenance import KEY_SPAN_DAYS, LOG_TABLES, MAKE_ORDER, log_size, maintain, utc_today
from clarion.pg import asyncpg_dsn
from harness.services import drop_database, fresh_database
from schema.ids import uuid7
from schema.partition_ranges import span_start
from schema.partitions import existing_days, existing_ranges, partition_name

DAY = dt.timedelta(days=1)
TABLES = [t.name for t in LOG_TABLES]
DAILY = [t for t in TABLES if t != "notification_keys"]  # the keys' partitions are weeks
WITH_DEFAULT = [t.name for t in LOG_TABLES if t.default_partition]  # the accept's tables have none


@pytest.fixture
async def conn() -> AsyncIterator[asyncpg.Connection]:
    url = await fresh_database("clarion_maint")  # migrated to head
    connection = await asyncpg.connect(asyncpg_dsn(url))
    await connection.execute("INSERT INTO tenants (id, name) VALUES ('t', 't')")
    await connection.execute("INSERT INTO users (id, tenant_id, external_id) VALUES ($1, 't', 'u')", uuid7())
    try:
        yield connection
    finally:
        await connection.close()
        await drop_database(url)


def at(day: dt.date, hh: int = 0, mm: int = 0, ss: int = 0, us: int = 0) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, hh, mm, ss, us, tzinfo=dt.UTC)


def ours(names: list[str], *, since: dt.date) -> list[str]:
    """The partitions in ``names`` from ``since`` on (not the migration's own days, which a clock
    run two months ahead drops too)."""
    return [n for n in names if n.rpartition("_p")[2] >= f"{since:%Y%m%d}"]


async def log_send(conn: asyncpg.Connection, *, event_id: str, status: str, at: dt.datetime) -> None:
    """A notification, its key, its engagement, an attempt and a sandbox message, all stamped ``at``."""
    nid = uuid7()
    user = await conn.fetchval("SELECT id FROM users LIMIT 1")
    await conn.execute(
        "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, status,"
        " history, created_at, updated_at) VALUES ($1, 't', $2, 'h', $3, 'email', $4, $5::jsonb, $6, $6)",
        nid, event_id, user, status, json.dumps([]), at,
    )  # fmt: skip
    await conn.execute(
        "INSERT INTO notification_keys VALUES ('t', $1, $2, $3, 'h')", event_id, at.date(), nid
    )
    await conn.execute(
        "INSERT INTO engagement (notification_id, type, link, tenant_id, notification_created_at, first_at,"
        " last_at, source) VALUES ($1, 'delivered', '', 't', $2, $2, $2, 'twilio')",
        nid, at,
    )  # fmt: skip
    await conn.execute(
        "INSERT INTO delivery_attempts (notification_id, attempt, provider, started_at, finished_at, outcome)"
        " VALUES ($1, 1, 'sandbox', $2, $2, 'sent')",
        nid, at,
    )  # fmt: skip
    await conn.execute(
        "INSERT INTO sandbox_messages (notification_id, tenant_id, channel, recipient, body,"
        " provider_message_id, created_at) VALUES ($1, 't', 'email', 'a@example.com', 'b', 'm', $2)",
        nid, at,
    )  # fmt: skip


async def test_tomorrow_exists_before_midnight_and_each_send_lands_in_its_day(
    conn: asyncpg.Connection,
) -> None:
    # Beyond the days the migration created, on a Sunday: tomorrow is a Monday, so the next day's
    # run also has to make the keys' next week (its seventh day ahead is the first of a week).
    today = utc_today() + 40 * DAY
    today += (6 - today.weekday()) * DAY
    report = await maintain(conn=conn, today=today, retention_days=30, partitions_ahead=7)
    assert all(report.days_ahead[t] == 7 for t in DAILY)
    # The keys' weeks reach to the end of the week holding the 7th day ahead.
    week_end = span_start(today + 7 * DAY, KEY_SPAN_DAYS) + KEY_SPAN_DAYS * DAY
    assert report.days_ahead["notification_keys"] == (week_end - today).days - 1
    # The clock runs past midnight: tomorrow's partitions were there before it, for every table.
    tomorrow = today + DAY
    for table in DAILY:
        assert tomorrow in await existing_days(conn, parent=table)
    key_weeks = [days for _, days in await existing_ranges(conn, parent="notification_keys")]
    assert any(week.covers(tomorrow) for week in key_weeks)
    assert {(w.end - w.start).days for w in key_weeks if w.start > utc_today() + 8 * DAY} == {7}
    await log_send(conn, event_id="before", status="sent", at=at(today, 23, 59, 59, 900_000))
    await log_send(conn, event_id="after", status="sent", at=at(tomorrow, 0, 0, 0, 100_000))
    rows = await conn.fetch("SELECT event_id, tableoid::regclass::text AS part FROM notifications")
    assert {r["event_id"]: r["part"] for r in rows} == {
        "before": partition_name("notifications", today),
        "after": partition_name("notifications", tomorrow),
    }
    keys = await conn.fetch("SELECT event_id, tableoid::regclass::text AS part FROM notification_keys")
    assert {r["event_id"]: r["part"] for r in keys} == {
        "before": partition_name("notification_keys", span_start(today, KEY_SPAN_DAYS)),
        "after": partition_name("notification_keys", span_start(tomorrow, KEY_SPAN_DAYS)),
    }
    # The next day's run keeps a week ahead, the keys' next week too, and nothing fell into a
    # default partition.
    report = await maintain(conn=conn, today=tomorrow, retention_days=30, partitions_ahead=7)
    assert report.created == [partition_name(t.name, tomorrow + 7 * DAY) for t in MAKE_ORDER]
    assert report.days_ahead["notification_keys"] == 13
    assert report.default_rows == dict.fromkeys(WITH_DEFAULT, 0)


async def test_retention_drops_old_days_but_keeps_a_day_holding_a_scheduled_send(
    conn: asyncpg.Connection,
) -> None:
    # A day far from the migration's own days, 31 days after a Sunday: the keys of that Sunday
    # and the Saturday before it share a week, which has just passed retention.
    today = utc_today() + 60 * DAY
    today += ((6 - (today - 31 * DAY).weekday()) % 7) * DAY
    old, older = today - 31 * DAY, today - 32 * DAY
    for day in (older, old):
        await maintain(conn=conn, today=day, retention_days=30, partitions_ahead=0)
    await log_send(conn, event_id="done", status="sent", at=at(older, 12))
    await log_send(conn, event_id="next-month", status="scheduled", at=at(old, 12))

    report = await maintain(conn=conn, today=today, retention_days=30, partitions_ahead=7)

    # Attempts and sandbox messages keep no day alive (a scheduled send has none yet; they are
    # stamped by the worker's clock); its rollups' day is kept for the count its outcome adds. The
    # keys' week is kept whole for the scheduled send's key; the key of "done" outlives its
    # notification with it (a repeat of it answers as one of a notification no longer kept).
    assert sorted(ours(report.dropped, since=old - 6 * DAY)) == sorted(
        [partition_name(t, older) for t in DAILY]
        + [partition_name(t, old) for t in ("delivery_attempts", "sandbox_messages")]
    )
    kept = await conn.fetch("SELECT event_id, status FROM notifications WHERE created_at < $1", at(today))
    assert [(r["event_id"], r["status"]) for r in kept] == [("next-month", "scheduled")]
    assert await conn.fetchval("SELECT notification_id FROM notification_keys WHERE event_id = 'next-month'")
    # Once it is sent, the next run drops its day too.
    await conn.execute("UPDATE notifications SET status = 'sent' WHERE event_id = 'next-month'")
    report = await maintain(conn=conn, today=today, retention_days=30, partitions_ahead=7)
    # Its engagement and rollups go right after it (never before: partition_drops.detach_followers).
    assert ours(report.dropped, since=old - 6 * DAY) == [
        partition_name("notification_keys", old - 6 * DAY),
        *(partition_name(t, old) for t in ("notifications", "engagement", "analytics_hourly")),
    ]
    assert await conn.fetchval("SELECT count(*) FROM notifications WHERE created_at < $1", at(today)) == 0


async def test_log_size_reports_bytes_and_the_oldest_day_kept(conn: asyncpg.Connection) -> None:
    today = utc_today()
    await maintain(conn=conn, today=today - 3 * DAY, retention_days=30, partitions_ahead=0)
    await log_send(conn, event_id="e", status="sent", at=at(today - 3 * DAY, 8))
    size = await log_size(conn=conn, today=today)
    assert size.oldest_day == today - 3 * DAY
    assert size.total_bytes > 0
    assert size.partitions_ahead == 7  # the migration's week ahead
    assert size.default_rows == 0


async def test_a_late_day_moves_out_of_the_default_partitions_of_the_tables_that_have_one(
    conn: asyncpg.Connection,
) -> None:
    late = utc_today() + 20 * DAY  # no partition yet: its rows land in the default partitions
    nid = uuid7()
    await conn.execute(
        "INSERT INTO engagement (notification_id, type, link, tenant_id, notification_created_at, first_at,"
        " last_at, source) VALUES ($1, 'delivered', '', 't', $2, $2, $2, 'twilio')",
        nid, at(late, 9),
    )  # fmt: skip
    assert await conn.fetchval("SELECT count(*) FROM engagement_default") == 1
    assert not await conn.fetchval("SELECT to_regclass('notifications_default')")

    report = await maintain(conn=conn, today=late, retention_days=30, partitions_ahead=7)

    assert report.default_rows == dict.fromkeys(WITH_DEFAULT, 0)
    part = await conn.fetchval(
        "SELECT tableoid::regclass::text FROM engagement WHERE notification_id = $1", nid
    )
    assert part == partition_name("engagement", late)


_DAY_TABLES = f"^({'|'.join(TABLES)})_p[0-9]{{8}}$"


async def day_tables(conn: asyncpg.Connection) -> dict[str, bool]:
    """Every day (or week) table of the log, and whether it is still a partition (False: detached,
    not yet dropped)."""
    rows = await conn.fetch(
        "SELECT relname, relispartition FROM pg_class WHERE relkind = 'r' AND relname ~ $1", _DAY_TABLES
    )
    return {r["relname"]: r["relispartition"] for r in rows}


async def two_expired_days(conn: asyncpg.Connection) -> dt.date:
    """Two days of sent notifications (all their tables) past a 30-day retention; returns the
    ``today`` that finds them expired, well past the migration's own days."""
    today = utc_today() + 60 * DAY
    await maintain(conn=conn, today=today - 32 * DAY, retention_days=30, partitions_ahead=1)
    for day in (today - 32 * DAY, today - 31 * DAY):
        await log_send(conn, event_id=f"{day}", status="sent", at=at(day, 12))
    return today


async def test_a_run_detaches_every_day_first_then_drops_them_one_step_per_pause(
    conn: asyncpg.Connection,
) -> None:
    today = await two_expired_days(conn)
    states = [await day_tables(conn)]
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:  # the upkeep's connection is idle between its steps
        pauses.append(seconds)
        states.append(await day_tables(conn))

    report = await maintain(
        conn=conn, today=today, retention_days=30, partitions_ahead=0, step_pause_s=7.0, sleep=sleep
    )
    states.append(await day_tables(conn))
    assert pauses and set(pauses) == {7.0}
    # Between two pauses exactly one table changed: one detach, or one drop.
    steps = []
    for before, after in itertools.pairwise(states):
        changed = [n for n in before if after.get(n) != before[n]]
        assert len(changed) == 1, changed
        steps.append("drop" if changed[0] not in after else "detach")
    # Every detach came before any drop, and each day detached was dropped in the same run.
    assert steps == sorted(steps, key=["detach", "drop"].index)
    assert steps.count("detach") == steps.count("drop") == len(report.dropped)
    for day in (today - 32 * DAY, today - 31 * DAY):
        assert {partition_name(t, day) for t in DAILY} <= set(report.dropped)
    assert all(states[-1].values())  # nothing left detached
    assert report.longest_work_s > 0


class Stopped(Exception):
    pass


async def test_days_a_stopped_run_left_detached_are_dropped_by_the_next(conn: asyncpg.Connection) -> None:
    today = await two_expired_days(conn)

    async def stop_once_a_day_of_notifications_is_detached(seconds: float) -> None:  # a crash
        if any(not on and n.startswith("notifications_p") for n, on in (await day_tables(conn)).items()):
            raise Stopped

    with pytest.raises(Stopped):
        await maintain(
            conn=conn, today=today, retention_days=30, partitions_ahead=0, step_pause_s=1.0,
            sleep=stop_once_a_day_of_notifications_is_detached,
        )  # fmt: skip
    tables = await day_tables(conn)
    left = [name for name, attached in tables.items() if not attached]
    (day,) = [n.rpartition("_p")[2] for n in left if n.startswith("notifications_p")]
    assert tables[f"engagement_p{day}"]  # its engagement goes after it, never before

    report = await maintain(conn=conn, today=today, retention_days=30, partitions_ahead=0)
    assert set(left) <= set(report.dropped)
    tables = await day_tables(conn)
    assert not set(left) & set(tables)
    assert all(tables.values())  # nothing left detached
    for table, key in (("notifications", "created_at"), ("engagement", "notification_created_at")):
        assert await conn.fetchval(f"SELECT count(*) FROM {table} WHERE {key} < $1", at(today)) == 0
