"""Daily partitions: created ahead across a midnight, expired days dropped whole, live rows kept."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import AsyncIterator

import asyncpg
import pytest

from clarion.pg import asyncpg_dsn
from schema import partition_drops, partitions

DAY = dt.timedelta(days=1)
LIVE = "status IN ('scheduled', 'accepted', 'queued', 'sending', 'retrying', 'delayed')"


@pytest.fixture
async def log(database_url: str) -> AsyncIterator[tuple[asyncpg.Connection, str]]:
    dsn = asyncpg_dsn(database_url)
    conn = await asyncpg.connect(dsn)
    parent = f"plog_{secrets.token_hex(3)}"
    await conn.execute(
        f"CREATE TABLE {parent} (id bigint, status text NOT NULL, created_at timestamptz NOT NULL,"
        f" PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)"
    )
    try:
        yield conn, parent
    finally:
        await conn.execute(f"DROP TABLE {parent} CASCADE")
        await conn.close()


def at(day: dt.date, hh: int = 0, mm: int = 0, ss: int = 0) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, hh, mm, ss, tzinfo=dt.UTC)


async def test_a_send_at_midnight_lands_in_its_own_day(log: tuple[asyncpg.Connection, str]) -> None:
    conn, parent = log
    today = dt.date(2026, 11, 25)
    created = await partitions.ensure_ahead(
        conn, parent=parent, today=today, days_ahead=7, default_partition=True
    )
    assert len(created) == 8
    assert await partitions.days_ahead(conn, parent=parent, today=today) == 7
    # The clock runs past the boundary: the loop's next run (the next day) keeps 7 days ahead.
    tomorrow = today + DAY
    assert await partitions.ensure_ahead(
        conn, parent=parent, today=tomorrow, days_ahead=7, default_partition=True
    ) == [partitions.partition_name(parent, tomorrow + 7 * DAY)]
    for i, when in enumerate([at(today, 23, 59, 59), at(tomorrow), at(tomorrow + 7 * DAY, 12)]):
        await conn.execute(f"INSERT INTO {parent} VALUES ($1, 'sent', $2)", i, when)
    where = await conn.fetch(f"SELECT tableoid::regclass::text AS part FROM {parent} ORDER BY id")
    assert [r["part"] for r in where] == [
        partitions.partition_name(parent, today),
        partitions.partition_name(parent, tomorrow),
        partitions.partition_name(parent, tomorrow + 7 * DAY),
    ]
    assert await partitions.default_rows(conn, parent=parent) == 0


async def test_a_row_beyond_the_horizon_lands_in_the_default_and_is_counted(
    log: tuple[asyncpg.Connection, str],
) -> None:
    conn, parent = log
    today = dt.date(2026, 11, 25)
    await partitions.ensure_ahead(conn, parent=parent, today=today, days_ahead=1, default_partition=True)
    await conn.execute(f"INSERT INTO {parent} VALUES (1, 'sent', $1)", at(today + 5 * DAY))
    assert await partitions.default_rows(conn, parent=parent) == 1
    assert await partitions.days_ahead(conn, parent=parent, today=today + 2 * DAY) == 0


async def test_retention_drops_whole_days_but_keeps_one_with_a_scheduled_send(
    log: tuple[asyncpg.Connection, str],
) -> None:
    conn, parent = log
    start = dt.date(2026, 10, 1)
    await partitions.ensure_ahead(conn, parent=parent, today=start, days_ahead=40, default_partition=True)
    for i in range(41):
        await conn.execute(f"INSERT INTO {parent} VALUES ($1, 'sent', $2)", i, at(start + i * DAY, 9))
    # A send accepted on day 2 and scheduled a month out is still live.
    await conn.execute(f"INSERT INTO {parent} VALUES (100, 'scheduled', $1)", at(start + 2 * DAY, 10))
    today = start + 40 * DAY
    dropped = await partition_drops.drop_expired(
        conn, parent=parent, today=today, retention_days=30, live_filter=LIVE
    )
    assert dropped == [partitions.partition_name(parent, start + i * DAY) for i in range(10) if i != 2]
    days = await partitions.existing_days(conn, parent=parent)
    assert days[0] == start + 2 * DAY and days[1] == today - 30 * DAY
    assert await conn.fetchval(f"SELECT status FROM {parent} WHERE id = 100") == "scheduled"
    assert await conn.fetchval(f"SELECT count(*) FROM {parent}") == 41 - 9 + 1
    # Once that send is terminal, the next run drops its day too.
    await conn.execute(f"UPDATE {parent} SET status = 'sent' WHERE id = 100")
    assert await partition_drops.drop_expired(
        conn, parent=parent, today=today, retention_days=30, live_filter=LIVE
    ) == [partitions.partition_name(parent, start + 2 * DAY)]


async def test_names_that_are_not_plain_identifiers_are_refused(
    log: tuple[asyncpg.Connection, str],
) -> None:
    conn, _ = log
    with pytest.raises(ValueError):
        await partitions.ensure_ahead(conn, parent="x; DROP TABLE t", today=dt.date.today(), days_ahead=1)
    with pytest.raises(ValueError):
        await partition_drops.drop_expired(conn, parent="plog", today=dt.date.today(), retention_days=0)


async def test_a_day_that_landed_in_the_default_gets_its_partition_and_keeps_its_rows(
    log: tuple[asyncpg.Connection, str],
) -> None:
    conn, parent = log
    today = dt.date(2026, 11, 25)
    await partitions.ensure_ahead(conn, parent=parent, today=today, days_ahead=0, default_partition=True)
    late = today + 3 * DAY  # the loop stopped; sends of that day went to the default
    await conn.execute(
        f"INSERT INTO {parent} VALUES (1, 'sent', $1), (2, 'scheduled', $2)", at(late, 1), at(late, 23)
    )
    await conn.execute(f"INSERT INTO {parent} VALUES (3, 'sent', $1)", at(late + DAY, 5))
    await partitions.ensure_ahead(conn, parent=parent, today=late, days_ahead=0, default_partition=True)
    rows = await conn.fetch(f"SELECT id, tableoid::regclass::text AS part FROM {parent} ORDER BY id")
    assert [(r["id"], r["part"]) for r in rows] == [
        (1, partitions.partition_name(parent, late)),
        (2, partitions.partition_name(parent, late)),
        (3, f"{parent}_default"),
    ]
    assert await partitions.default_rows(conn, parent=parent) == 1


async def test_partitions_get_the_fill_factor_asked_for(log: tuple[asyncpg.Connection, str]) -> None:
    conn, parent = log
    today = dt.date(2026, 11, 25)
    await partitions.ensure_ahead(
        conn, parent=parent, today=today, days_ahead=1, fillfactor=80, default_partition=True
    )
    await conn.execute(f"INSERT INTO {parent} VALUES (1, 'sent', $1)", at(today + 5 * DAY))  # the default
    await partitions.ensure_ahead(
        conn, parent=parent, today=today + 5 * DAY, days_ahead=0, fillfactor=80, default_partition=True
    )
    options = await conn.fetch(
        "SELECT c.relname, c.reloptions FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = $1::regclass",
        parent,
    )
    # Made ahead, the default, and a day moved out of the default: each leaves room on its pages.
    assert len(options) == 4
    assert all(r["reloptions"] == ["fillfactor=80"] for r in options), options
    with pytest.raises(ValueError, match="fillfactor"):
        await partitions.ensure_ahead(
            conn, parent=parent, today=today, days_ahead=0, fillfactor=5, default_partition=True
        )
