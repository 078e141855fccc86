"""The webhook tables keep their days: partitions ahead, expired days dropped whole, a day with a
pending delivery of an enabled endpoint kept until it is done, and a disabled endpoint's delivery
still pending past retention cancelled so its day goes."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from uuid import UUID

import asyncpg
import pytest

from clarion.pg import create_pool
from harness.services import drop_database, fresh_database
from schema.partitions import existing_days
from workers.webhook_retention import DAYS_AHEAD, maintain

TODAY = dt.date(2026, 11, 25)
INSERT_DELIVERY = """
INSERT INTO webhook_deliveries (id, created_at, endpoint_id, tenant_id, event_id, event_type, body, state)
VALUES (gen_random_uuid(), $1, coalesce($3, gen_random_uuid()), 't', gen_random_uuid(), 'notification.sent',
        '{}', $2)
"""
INSERT_ENDPOINT = """
INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, enabled, secret)
VALUES (gen_random_uuid(), 't', 'https://hooks.example.com/', '{}', $1, 'whsec_x') RETURNING id
"""


async def _endpoint(conn: asyncpg.Connection, *, enabled: bool) -> UUID:
    await conn.execute("INSERT INTO tenants (id, name) VALUES ('t', 't') ON CONFLICT DO NOTHING")
    return UUID(str(await conn.fetchval(INSERT_ENDPOINT, enabled)))


@pytest.fixture
async def pool() -> AsyncIterator[asyncpg.Pool]:
    url = await fresh_database("clarion_webhook_retention")
    p = await create_pool(url, size=2)
    yield p
    await p.close()
    await drop_database(url)


def _at(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(12), tzinfo=dt.UTC)


async def test_expired_days_go_and_a_day_holding_a_pending_delivery_stays(pool: asyncpg.Pool) -> None:
    old, older = TODAY - dt.timedelta(days=9), TODAY - dt.timedelta(days=10)
    await maintain(pool=pool, today=older, retention_days=7)
    async with pool.acquire() as conn:
        assert len(await existing_days(conn, parent="webhook_deliveries")) == DAYS_AHEAD + 1
        await conn.execute(INSERT_DELIVERY, _at(older), "delivered", None)
        await conn.execute(INSERT_DELIVERY, _at(old), "pending", await _endpoint(conn, enabled=True))
        await conn.execute(
            "INSERT INTO webhook_events (id, created_at, tenant_id, type, occurred_at, body)"
            " VALUES (gen_random_uuid(), $1, 't', 'notification.sent', $1, '{}')",
            _at(older),
        )
    dropped = await maintain(pool=pool, today=TODAY, retention_days=7)
    # Days older..older+3 were made; those before TODAY - 7 go, but for the pending delivery's.
    expired = [
        older + dt.timedelta(days=i)
        for i in range(DAYS_AHEAD + 1)
        if older + dt.timedelta(days=i) < TODAY - dt.timedelta(days=7)
    ]
    expected = [f"webhook_events_p{d:%Y%m%d}" for d in expired]
    expected += [f"webhook_deliveries_p{d:%Y%m%d}" for d in expired if d != old]
    assert sorted(dropped) == sorted(expected) and len(expected) == 5
    async with pool.acquire() as conn:
        days = await existing_days(conn, parent="webhook_deliveries")
        assert old in days and TODAY + dt.timedelta(days=DAYS_AHEAD) in days
        await conn.execute("UPDATE webhook_deliveries SET state = 'delivered'")
    assert await maintain(pool=pool, today=TODAY, retention_days=7) == [f"webhook_deliveries_p{old:%Y%m%d}"]


async def test_a_disabled_endpoints_delivery_still_pending_past_retention_is_cancelled_and_its_day_goes(
    pool: asyncpg.Pool,
) -> None:
    old = TODAY - dt.timedelta(days=9)
    await maintain(pool=pool, today=old, retention_days=7)
    async with pool.acquire() as conn:
        await conn.execute(INSERT_DELIVERY, _at(old), "pending", await _endpoint(conn, enabled=False))
        await conn.execute(INSERT_DELIVERY, _at(TODAY), "pending", await _endpoint(conn, enabled=False))
    dropped = await maintain(pool=pool, today=TODAY, retention_days=7)
    assert f"webhook_deliveries_p{old:%Y%m%d}" in dropped
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT created_at, state FROM webhook_deliveries")
    assert [(r["created_at"].date(), r["state"]) for r in rows] == [
        (TODAY, "pending")
    ]  # within retention: waits
