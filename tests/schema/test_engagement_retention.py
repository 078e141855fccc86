"""The engagement table goes with the notification log: a row is stored only for a notification in
the log, and its days can be created ahead and dropped whole by schema.partitions once the log's
loop runs (docs/partitioning.md), rows that landed in the default partition moved out first."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import asyncpg
import pytest

from clarion.pg import asyncpg_dsn
from core.engagement import EngagementEvent, record_engagement
from harness.services import drop_database, fresh_database
from schema import partition_drops, partitions
from schema.enums import EngagementType

DAY = dt.date(2001, 2, 3)


@pytest.fixture
async def conn() -> AsyncIterator[asyncpg.Connection]:
    url = await fresh_database("clarion_engagement")
    dsn = asyncpg_dsn(url)
    connection = await asyncpg.connect(dsn)
    try:
        yield connection
    finally:
        await connection.close()
        await drop_database(url)


async def _engaged_notification(conn: asyncpg.Connection, created_at: dt.datetime) -> object:
    await conn.execute("INSERT INTO tenants (id, name) VALUES ('t', 't') ON CONFLICT DO NOTHING")
    await partitions.ensure_ahead(  # the log has no default partition: its day first
        conn, parent="notifications", today=created_at.date(), days_ahead=0, default_partition=False
    )
    user = await conn.fetchval(
        "INSERT INTO users (id, tenant_id, external_id) VALUES (gen_random_uuid(), 't', gen_random_uuid()::text)"
        " RETURNING id"
    )
    nid = await conn.fetchval(
        "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, data, created_at)"
        " VALUES (gen_random_uuid(), 't', gen_random_uuid()::text, 'x', $1, 'push', '{}', $2) RETURNING id",
        user,
        created_at,
    )
    await conn.execute(
        "INSERT INTO engagement (notification_id, type, tenant_id, notification_created_at, first_at, last_at,"
        " source) VALUES ($1, 'opened', 't', $2, $2, $2, 'api')",
        nid,
        created_at,
    )
    return nid


async def test_a_report_is_stored_only_for_a_notification_in_the_log(conn: asyncpg.Connection) -> None:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    nid = await _engaged_notification(conn, at)  # one "opened" row already
    gone = await _engaged_notification(conn, at)
    await conn.execute("DELETE FROM engagement WHERE notification_id = $1", gone)
    await conn.execute("DELETE FROM notifications WHERE id = $1", gone)  # as if its day was dropped

    def clicked(notification_id: object, tenant_id: str = "t") -> EngagementEvent:
        return EngagementEvent(
            tenant_id=tenant_id, notification_id=notification_id, notification_created_at=at,  # type: ignore[arg-type]
            type=EngagementType.clicked, at=at, source="api", link="https://example.com/",
        )  # fmt: skip

    async with conn.transaction():
        recorded = await record_engagement(
            conn=conn, events=[clicked(nid), clicked(gone), clicked(nid, tenant_id="another")]
        )

    assert [(r.event.notification_id, r.event.tenant_id, r.counted) for r in recorded] == sorted(
        [(nid, "t", True), (gone, "t", False), (nid, "another", False)], key=lambda r: str(r[0])
    )
    stored = await conn.fetch("SELECT notification_id, type, tenant_id FROM engagement ORDER BY type")
    assert [tuple(r) for r in stored] == [(nid, "clicked", "t"), (nid, "opened", "t")]


async def test_a_day_is_split_out_of_the_default_partition_and_dropped_whole(
    conn: asyncpg.Connection,
) -> None:
    nid = await _engaged_notification(conn, dt.datetime(2001, 2, 3, 12, tzinfo=dt.UTC))
    assert await partitions.default_rows(conn, parent="engagement") == 1

    created = await partitions.ensure_ahead(conn, parent="engagement", today=DAY, days_ahead=1)

    assert created == ["engagement_p20010203", "engagement_p20010204"]
    assert await partitions.default_rows(conn, parent="engagement") == 0
    assert (
        await conn.fetchval("SELECT count(*) FROM engagement_p20010203 WHERE notification_id = $1", nid) == 1
    )
    # the upsert's key still finds the row in its day partition
    await conn.execute(
        "INSERT INTO engagement AS e (notification_id, type, tenant_id, notification_created_at, first_at,"
        " last_at, source) SELECT notification_id, type, tenant_id, notification_created_at, now(), now(), 'api'"
        " FROM engagement ON CONFLICT (notification_id, type, link, tenant_id, notification_created_at)"
        " DO UPDATE SET count = e.count + 1"
    )
    assert await conn.fetchval("SELECT count FROM engagement WHERE notification_id = $1", nid) == 2

    dropped = await partition_drops.drop_expired(
        conn, parent="engagement", today=DAY + dt.timedelta(days=30), retention_days=7
    )

    assert dropped == ["engagement_p20010203", "engagement_p20010204"]
    assert await conn.fetchval("SELECT count(*) FROM engagement") == 0
    assert (
        await conn.fetchval("SELECT count(*) FROM notifications WHERE id = $1", nid) == 1
    )  # the log's own loop
