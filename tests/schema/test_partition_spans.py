"""Partitions a week wide (the event-id keys'): made ahead, fitted around daily partitions an
install made before, and dropped only once their last day has passed retention."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import AsyncIterator

import asyncpg
import pytest

from clarion.pg import asyncpg_dsn
from schema import partition_drops, partitions
from schema.partition_ranges import DayRange

DAY = dt.timedelta(days=1)
MON = dt.date(2031, 3, 3)  # a Monday, clear of any day the session's schema made
THU = MON + 3 * DAY


@pytest.fixture
async def keys(database_url: str) -> AsyncIterator[tuple[asyncpg.Connection, str]]:
    """A table shaped like ``notification_keys``: range partitioned on a ``date``."""
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    parent = f"pkeys_{secrets.token_hex(3)}"
    await conn.execute(
        f"CREATE TABLE {parent} (k text NOT NULL, day date NOT NULL, PRIMARY KEY (k, day))"
        " PARTITION BY RANGE (day)"
    )
    try:
        yield conn, parent
    finally:
        await conn.execute(f"DROP TABLE {parent} CASCADE")
        await conn.close()


async def ranges(conn: asyncpg.Connection, parent: str) -> list[DayRange]:
    return [days for _, days in await partitions.existing_ranges(conn, parent=parent)]


async def test_weeks_are_made_ahead_once_and_hold_every_day_of_them(
    keys: tuple[asyncpg.Connection, str],
) -> None:
    conn, parent = keys
    created = await partitions.ensure_ahead(conn, parent=parent, today=THU, days_ahead=7, span_days=7)
    assert created == [
        partitions.partition_name(parent, MON),
        partitions.partition_name(parent, MON + 7 * DAY),
    ]
    assert await ranges(conn, parent) == [
        DayRange(MON, MON + 7 * DAY),
        DayRange(MON + 7 * DAY, MON + 14 * DAY),
    ]
    assert await partitions.days_ahead(conn, parent=parent, today=THU) == 10  # to the next Sunday
    assert await partitions.ensure_ahead(conn, parent=parent, today=THU, days_ahead=7, span_days=7) == []
    for offset in range(14):
        await conn.execute(f"INSERT INTO {parent} VALUES ('k', $1)", MON + offset * DAY)
    assert await partitions.default_rows(conn, parent=parent) == 0


async def test_daily_partitions_of_an_older_install_are_kept_and_the_week_fits_around_them(
    keys: tuple[asyncpg.Connection, str],
) -> None:
    conn, parent = keys
    await partitions.ensure_ahead(conn, parent=parent, today=MON, days_ahead=3)  # Mon .. Thu, daily
    created = await partitions.ensure_ahead(conn, parent=parent, today=THU, days_ahead=7, span_days=7)
    assert created == [
        partitions.partition_name(parent, THU + DAY),
        partitions.partition_name(parent, MON + 7 * DAY),
    ]
    assert (await ranges(conn, parent))[-2:] == [
        DayRange(THU + DAY, MON + 7 * DAY),
        DayRange(MON + 7 * DAY, MON + 14 * DAY),
    ]


async def test_rows_that_fell_into_the_default_move_into_their_week(
    keys: tuple[asyncpg.Connection, str],
) -> None:
    conn, parent = keys
    await partitions.ensure_ahead(
        conn, parent=parent, today=MON, days_ahead=0, span_days=7, default_partition=True
    )
    await conn.execute(
        f"INSERT INTO {parent} VALUES ('late', $1), ('later', $2)", MON + 8 * DAY, MON + 13 * DAY
    )
    assert await partitions.default_rows(conn, parent=parent) == 2
    await partitions.ensure_ahead(conn, parent=parent, today=MON + 7 * DAY, days_ahead=0, span_days=7)
    assert await partitions.default_rows(conn, parent=parent) == 0
    part = await conn.fetch(
        f"SELECT DISTINCT tableoid::regclass::text AS part FROM {parent} WHERE k LIKE 'late%'"
    )
    assert [r["part"] for r in part] == [partitions.partition_name(parent, MON + 7 * DAY)]


async def test_a_week_is_dropped_only_once_its_last_day_is_past_retention(
    keys: tuple[asyncpg.Connection, str],
) -> None:
    conn, parent = keys
    await partitions.ensure_ahead(conn, parent=parent, today=MON, days_ahead=0, span_days=7)
    sunday = MON + 6 * DAY
    kept = await partition_drops.drop_expired(conn, parent=parent, today=sunday + 30 * DAY, retention_days=30)
    assert kept == [] and await ranges(conn, parent) == [DayRange(MON, MON + 7 * DAY)]
    dropped = await partition_drops.drop_expired(
        conn, parent=parent, today=sunday + 31 * DAY, retention_days=30
    )
    assert dropped == [partitions.partition_name(parent, MON)]
    assert await ranges(conn, parent) == []


@pytest.mark.parametrize("datestyle", ["ISO, YMD", "German", "SQL, MDY", "Postgres, DMY"])
@pytest.mark.parametrize("zone", ["UTC", "Asia/Tokyo", "America/Los_Angeles"])
async def test_bounds_read_as_utc_days_whatever_the_sessions_datestyle_and_time_zone(
    keys: tuple[asyncpg.Connection, str], datestyle: str, zone: str
) -> None:
    conn, parent = keys
    stamped = f"{parent}_ts"
    await conn.execute(f"CREATE TABLE {stamped} (id bigint, at timestamptz NOT NULL) PARTITION BY RANGE (at)")
    try:
        await partitions.ensure_ahead(conn, parent=parent, today=THU, days_ahead=0, span_days=7)
        await partitions.ensure_ahead(conn, parent=stamped, today=THU, days_ahead=1)
        await conn.execute(f"SET DateStyle = '{datestyle}'")
        await conn.execute(f"SET TimeZone = '{zone}'")
        assert await ranges(conn, parent) == [DayRange(MON, MON + 7 * DAY)]
        assert await ranges(conn, stamped) == [DayRange(THU, THU + DAY), DayRange(THU + DAY, THU + 2 * DAY)]
    finally:
        await conn.execute("RESET DateStyle")
        await conn.execute("RESET TimeZone")
        await conn.execute(f"DROP TABLE {stamped} CASCADE")


async def test_partitions_clarion_did_not_make_are_never_counted_or_dropped(
    keys: tuple[asyncpg.Connection, str],
) -> None:
    conn, parent = keys
    await conn.execute(
        f"CREATE TABLE {parent}_archive PARTITION OF {parent} FOR VALUES FROM ('2001-01-01') TO ('2002-01-01')"
    )
    await conn.execute(
        f"CREATE TABLE {parent}_old PARTITION OF {parent} FOR VALUES FROM (MINVALUE) TO ('2000-01-01')"
    )
    await partitions.ensure_ahead(
        conn, parent=parent, today=MON, days_ahead=0, span_days=7, default_partition=True
    )
    assert await ranges(conn, parent) == [DayRange(MON, MON + 7 * DAY)]
    dropped = await partition_drops.drop_expired(
        conn, parent=parent, today=MON + 400 * DAY, retention_days=30
    )
    assert dropped == [partitions.partition_name(parent, MON)]
    left = await conn.fetch(
        "SELECT inhrelid::regclass::text AS name FROM pg_inherits WHERE inhparent = $1::regclass", parent
    )
    assert sorted(r["name"] for r in left) == sorted(
        [f"{parent}_archive", f"{parent}_default", f"{parent}_old"]
    )
