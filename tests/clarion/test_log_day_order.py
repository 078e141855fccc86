"""A day of the log is made table by table, the accept's tables last (``clarion.log_maintenance.
MAKE_ORDER``), by the upkeep and by a write that found its day missing alike: until the day of
``notifications`` is there, no notification of that day is, so nothing keyed by one (its
engagement, its rollups) is written for it, and no such row lands in a default partition that
making its day would then move out under the writers (``tests/api/test_engagement_moved_day.py``).

Before, ``analytics_hourly``, ``delivery_attempts`` and ``sandbox_messages`` got their day after
``notifications``: a send accepted on a day made on demand could be recorded into their defaults.
Each test stops the making of the day at ``notifications`` (a lock it waits for) and looks."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import asyncpg
import pytest

from clarion.log_maintenance import LOG_TABLES, maintain
from clarion.missing_days import MissingDay, create_missing_day
from clarion.pg import asyncpg_dsn
from harness.services import drop_database, fresh_database, wait_until
from schema.partitions import existing_ranges

DAY = dt.date(2001, 2, 3)  # long before the migration's days: no table has it
WITH_DEFAULT = [t.name for t in LOG_TABLES if t.default_partition]
# The making of the day, waiting for the holder's lock on notifications.
WAITING = """
SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE NOT l.granted AND a.datname = current_database() AND l.relation = 'notifications'::regclass
"""


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    url = await fresh_database("clarion_day_order")
    yield asyncpg_dsn(url)
    await drop_database(url)


async def _has_day(conn: asyncpg.Connection, table: str) -> bool:
    return any(days.covers(DAY) for _, days in await existing_ranges(conn, parent=table))


def _upkeep(conn: asyncpg.Connection) -> Coroutine[Any, Any, object]:
    return maintain(conn=conn, today=DAY, retention_days=30, partitions_ahead=0)


def _on_demand(conn: asyncpg.Connection) -> Coroutine[Any, Any, object]:
    # What a send refused for want of its day reports (PostgreSQL's detail, as printed).
    return create_missing_day(conn=conn, missing=MissingDay("notifications", f"{DAY} 12:00:00+00"))


@pytest.mark.parametrize("make", [_upkeep, _on_demand], ids=["upkeep", "on_demand"])
async def test_a_day_of_notifications_is_made_after_that_day_of_every_table_with_a_default(
    dsn: str, make: Callable[[asyncpg.Connection], Coroutine[Any, Any, object]]
) -> None:
    holder, maker, probe = [await asyncpg.connect(dsn) for _ in range(3)]
    try:
        async with holder.transaction():
            await holder.execute("LOCK TABLE notifications IN SHARE UPDATE EXCLUSIVE MODE")
            making = asyncio.create_task(make(maker))

            async def waiting() -> bool:
                return making.done() or bool(await probe.fetchval(WAITING))

            await wait_until(waiting, 15, 0.01)
            assert not making.done()  # it waits to make the day of notifications
            made = {t.name: await _has_day(probe, t.name) for t in LOG_TABLES}
        await making
        assert not made["notifications"]
        assert {t: made[t] for t in WITH_DEFAULT} == dict.fromkeys(WITH_DEFAULT, True)
        assert all([await _has_day(probe, t.name) for t in LOG_TABLES])  # and then every table's
    finally:
        for conn in (holder, maker, probe):
            await conn.close()
