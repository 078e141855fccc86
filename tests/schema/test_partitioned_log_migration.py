"""Migration 0009_partitioned_log on a database filled by the previous schema (0008): every row of every status is kept,
lands in its day's partition, and the API still finds it (and still knows its event id)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from clarion.broker import TansuBroker
from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from harness.services import ApiServer, drop_database, pg_url
from harness.tenants import TenantInfo, make_tenant
from schema.db import create_engine, ensure_database, upgrade
from schema.enums import Status
from schema.ids import uuid7, uuid7_at
from schema.partitions import default_rows, partition_name
from tests.conftest import TEST_REDIS_PREFIX
from tests.fixtures.sends import email_send

DAY = dt.timedelta(days=1)


@pytest.fixture
async def old_database() -> AsyncIterator[str]:
    url = pg_url(f"clarion_mig4_{secrets.token_hex(3)}")
    await ensure_database(url)
    await asyncio.to_thread(upgrade, url, "0008")
    try:
        yield url
    finally:
        await drop_database(url)


async def fill(conn: asyncpg.Connection, tenant_id: str) -> dict[str, tuple[str, str, dt.datetime]]:
    """One notification per status, on days from 20 days ago to today, each with two attempts,
    a sandbox message, an engagement row and a rollup; returns {id: (event id, status, created_at)}."""
    user = uuid7()
    await conn.execute(
        "INSERT INTO users (id, tenant_id, external_id, email) VALUES ($1, $2, 'u-1', 'ada@example.com')",
        user, tenant_id,
    )  # fmt: skip
    now = dt.datetime.now(dt.UTC).replace(microsecond=0)
    rows: dict[str, tuple[str, str, dt.datetime]] = {}
    for i, status in enumerate(Status):
        created = now - (i * 36 % 20) * DAY - dt.timedelta(minutes=i)
        nid = uuid7_at(created)
        event_id = f"old-{status.value}"
        await conn.execute(
            "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, status,"
            " attempts, history, created_at, updated_at)"
            " VALUES ($1, $2, $3, 'old-hash', $4, 'email', $5, 2, $6::jsonb, $7, $7)",
            nid, tenant_id, event_id, user, status.value,
            json.dumps([{"status": status.value, "at": created.isoformat(), "detail": None}]), created,
        )  # fmt: skip
        for attempt in (1, 2):
            started = created + attempt * dt.timedelta(seconds=30)
            await conn.execute(
                "INSERT INTO delivery_attempts (notification_id, attempt, provider, started_at, finished_at,"
                " outcome) VALUES ($1, $2, 'sandbox', $3, $3, 'transient')",
                nid, attempt, started,
            )  # fmt: skip
        await conn.execute(
            "INSERT INTO sandbox_messages (notification_id, tenant_id, channel, recipient, body,"
            " provider_message_id, created_at) VALUES ($1, $2, 'email', 'ada@example.com', 'hi', $3, $4)",
            nid, tenant_id, f"sb-{i}", created,
        )  # fmt: skip
        await conn.execute(
            "INSERT INTO engagement (notification_id, type, link, tenant_id, notification_created_at, first_at,"
            " last_at, source) VALUES ($1, 'delivered', '', $2, $3, $3, $3, 'sendgrid')",
            nid, tenant_id, created,
        )  # fmt: skip
        await conn.execute(
            "INSERT INTO analytics_hourly (tenant_id, hour, channel, template, template_version, category,"
            " provider, accepted) VALUES ($1, date_trunc('hour', $2::timestamptz), 'email', $3, 1, 'general',"
            " '', 1)",
            tenant_id, created, status.value,
        )  # fmt: skip
        rows[str(nid)] = (event_id, status.value, created)
    return rows


async def test_upgrade_keeps_every_row_and_the_api_finds_them(old_database: str, kafka: TansuBroker) -> None:
    engine = create_engine(old_database, pool_size=2)
    tenant: TenantInfo = await make_tenant(engine)
    await engine.dispose()
    conn = await asyncpg.connect(asyncpg_dsn(old_database))
    try:
        rows = await fill(conn, tenant.id)
        await asyncio.to_thread(upgrade, old_database)

        assert await conn.fetchval("SELECT count(*) FROM notifications") == len(Status)
        assert await conn.fetchval("SELECT count(*) FROM delivery_attempts") == 2 * len(Status)
        assert await conn.fetchval("SELECT count(*) FROM sandbox_messages") == len(Status)
        assert await conn.fetchval("SELECT count(*) FROM notification_keys") == len(Status)
        assert await conn.fetchval("SELECT count(*) FROM engagement") == len(Status)
        assert await conn.fetchval("SELECT count(*) FROM analytics_hourly") == len(Status)
        placed = await conn.fetch("SELECT id, tableoid::regclass::text AS part FROM notifications")
        for r in placed:
            assert r["part"] == partition_name("notifications", rows[str(r["id"])][2].date())
        for table in (
            "notifications",
            "delivery_attempts",
            "sandbox_messages",
            "notification_keys",
            "engagement",
            "analytics_hourly",
        ):
            assert await default_rows(conn, parent=table) == 0
        # The sequences carried over: a new attempt does not reuse an id.
        newest = await conn.fetchval(
            "INSERT INTO delivery_attempts (notification_id, attempt, provider, started_at, finished_at,"
            " outcome) VALUES ($1, 1, 'sandbox', now(), now(), 'sent') RETURNING id",
            uuid7(),
        )
        assert newest == 2 * len(Status) + 1
    finally:
        await conn.close()

    settings = Settings(
        env="test", redis_key_prefix=TEST_REDIS_PREFIX, database_url=old_database,
        kafka_bootstrap=kafka.bootstrap, db_pool_size=2,
    )  # fmt: skip
    api = ApiServer(settings)
    await api.start()
    try:
        async with httpx.AsyncClient(
            base_url=api.url, headers={"Authorization": f"Bearer {tenant.key}"}, timeout=15
        ) as client:
            for nid, (event_id, status, _) in rows.items():
                got = await client.get(f"/v1/notifications/{nid}")
                assert got.status_code == 200, got.text
                body = got.json()
                assert (body["event_id"], body["status"]) == (event_id, status)
                assert [a["attempt"] for a in body["delivery_attempts"]] == [1, 2]
            # The event ids used before the upgrade are still known: a different body is a 409.
            oldest = max(rows.items(), key=lambda kv: dt.datetime.now(dt.UTC) - kv[1][2])
            repeat = await client.post("/v1/notifications", json=email_send(event_id=oldest[1][0]))
            assert repeat.status_code == 409, repeat.text
            assert repeat.json()["error"]["details"]["id"] == oldest[0]
    finally:
        await api.stop()
