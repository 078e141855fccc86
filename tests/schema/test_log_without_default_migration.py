"""Migration 0016 on a database filled by the previous schema (0015): the rows in the default
partitions of notifications and notification_keys (days the upkeep had not made) move into day
partitions made for them, every row is kept, and the default partitions are gone."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets
from collections.abc import AsyncIterator

import asyncpg
import pytest

from clarion.pg import asyncpg_dsn
from harness.services import drop_database, pg_url
from schema.db import ensure_database, upgrade
from schema.ids import uuid7_at
from schema.partitions import existing_ranges, partition_name

DAY = dt.timedelta(days=1)


@pytest.fixture
async def old_database() -> AsyncIterator[str]:
    url = pg_url(f"clarion_mig16_{secrets.token_hex(3)}")
    await ensure_database(url)
    await asyncio.to_thread(upgrade, url, "0015")
    try:
        yield url
    finally:
        await drop_database(url)


async def test_upgrade_moves_the_default_partitions_rows_into_days_and_keeps_every_row(
    old_database: str,
) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(old_database))
    try:
        now = dt.datetime.now(dt.UTC).replace(microsecond=0)
        # 20 days ago and 12 ahead have no partition (0009 made today .. today + 7): the defaults.
        # Today has one. Two sends on one missing day, one just before its midnight.
        stamps = [now - 20 * DAY, now - 20 * DAY + dt.timedelta(hours=1), now, now + 12 * DAY]
        stamps[1] = dt.datetime.combine(stamps[0].date(), dt.time(23, 59, 59, 999_999), dt.UTC)
        await conn.execute("INSERT INTO tenants (id, name) VALUES ('t', 't')")
        user = await conn.fetchval(
            "INSERT INTO users (id, tenant_id, external_id) VALUES (gen_random_uuid(), 't', 'u') RETURNING id"
        )
        sent: dict[str, dt.datetime] = {}
        for i, at in enumerate(stamps):
            nid = uuid7_at(at)
            await conn.execute(
                "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, status,"
                " history, created_at, updated_at) VALUES ($1, 't', $2, 'h', $3, 'email', 'sent', $4::jsonb, $5, $5)",
                nid, f"e{i}", user, json.dumps([]), at,
            )  # fmt: skip
            await conn.execute(
                "INSERT INTO notification_keys VALUES ('t', $1, $2, $3, 'h')", f"e{i}", at.date(), nid
            )
            sent[str(nid)] = at
        assert await conn.fetchval("SELECT count(*) FROM notifications_default") == 3
        assert await conn.fetchval("SELECT count(*) FROM notification_keys_default") == 3

        await asyncio.to_thread(upgrade, old_database)

        for parent in ("notifications", "notification_keys"):
            assert await conn.fetchval("SELECT to_regclass($1)", f"{parent}_default") is None
            assert await conn.fetchval(f"SELECT count(*) FROM {parent}") == len(stamps)
        placed = await conn.fetch("SELECT id, tableoid::regclass::text AS part FROM notifications")
        assert {str(r["id"]): r["part"] for r in placed} == {
            nid: partition_name("notifications", at.date()) for nid, at in sent.items()
        }
        keys = await conn.fetch(
            "SELECT event_id, day, tableoid::regclass::text AS part FROM notification_keys"
        )
        ranges = dict(await existing_ranges(conn, parent="notification_keys"))
        assert len(keys) == len(stamps) and all(ranges[k["part"]].covers(k["day"]) for k in keys)
        # The days made for them are the upkeep's own: counted, and the log's fill factor.
        options = await conn.fetchval(
            "SELECT reloptions FROM pg_class WHERE relname = $1",
            partition_name("notifications", stamps[0].date()),
        )
        assert options == ["fillfactor=80"]
    finally:
        await conn.close()
