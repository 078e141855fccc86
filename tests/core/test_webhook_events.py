"""``core.webhook_events.enqueue_events`` over the real database, on a connection of the workers'
pool: a batch mixing tenants and types logs each event of a tenant with an endpoint, with its own
body to the byte, and queues it to each enabled endpoint subscribed to its type, and to no other;
an endpoint being disabled or deleted gets nothing queued once that commits."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import asyncpg
import pytest

from clarion.pg import create_pool
from core.webhook_events import LOCK_ENDPOINT, WebhookEventIn, enqueue_events
from harness.services import wait_until
from harness.tenants import TenantInfo

HOOKED, QUIET = "t-hooked-events", "t-quiet-events"
AT = datetime(2026, 11, 25, 9, 0, 0, 123456, tzinfo=UTC)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A pool connection (its json codecs set) in a transaction rolled back after the test."""
    pool = await create_pool(database_url, size=1)
    try:
        async with pool.acquire() as connection:
            transaction = connection.transaction()
            await transaction.start()
            try:
                await connection.execute(
                    "INSERT INTO tenants (id, name) VALUES ($1, $1), ($2, $2)", HOOKED, QUIET
                )
                yield connection
            finally:
                await transaction.rollback()
    finally:
        await pool.close()


async def _endpoint(
    conn: asyncpg.Connection, types: list[str], *, enabled: bool = True, tenant_id: str = HOOKED
) -> uuid.UUID:
    endpoint_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, secret, enabled)"
        " VALUES ($1, $2, 'http://127.0.0.1:9/', $3, 'whsec_AAAA', $4)",
        endpoint_id, tenant_id, types, enabled,
    )  # fmt: skip
    return endpoint_id


def _event(i: int, tenant_id: str, type_: str) -> WebhookEventIn:
    notification_id = uuid.UUID(int=i + 1)
    return WebhookEventIn(
        tenant_id=tenant_id,
        notification_id=notification_id,
        type=f"notification.{type_}",
        data={"notification_id": str(notification_id), "i": i, "link": "https://x.example/é" if i else None},
        occurred_at=AT.replace(second=i),
    )


async def test_a_mixed_batch_logs_each_hooked_event_and_queues_it_to_each_subscribed_enabled_endpoint(
    conn: asyncpg.Connection,
) -> None:
    opened = await _endpoint(conn, ["notification.opened"])
    both = await _endpoint(conn, ["notification.opened", "notification.clicked"])
    await _endpoint(conn, ["notification.opened", "notification.clicked"], enabled=False)
    types = ["opened", "opened", "clicked", "sent", "opened", "clicked"]
    tenants = [HOOKED, QUIET, HOOKED, HOOKED, HOOKED, QUIET]
    await enqueue_events(
        conn, events=[_event(i, t, ty) for i, (t, ty) in enumerate(zip(tenants, types, strict=True))]
    )

    logged = await conn.fetch(
        "SELECT id, notification_id, type, occurred_at, body FROM webhook_events WHERE tenant_id IN ($1, $2)",
        HOOKED,
        QUIET,
    )
    by_i = {r["notification_id"].int - 1: r for r in logged}
    assert sorted(by_i) == [0, 2, 3, 4], "the quiet tenant's events are not logged"
    assert by_i[4]["body"] == (
        '{"type":"notification.opened","timestamp":"2026-11-25T09:00:04.123456Z","data":'
        '{"notification_id":"00000000-0000-0000-0000-000000000005","i":4,"link":"https://x.example/\\u00e9"}}'
    )
    assert by_i[0]["body"] == (
        '{"type":"notification.opened","timestamp":"2026-11-25T09:00:00.123456Z","data":'
        '{"notification_id":"00000000-0000-0000-0000-000000000001","i":0,"link":null}}'
    )
    for i, row in by_i.items():
        assert row["type"] == f"notification.{types[i]}" and f'"i":{i},' in row["body"]
        assert row["occurred_at"] == AT.replace(second=i)
    queued = await conn.fetch(
        "SELECT endpoint_id, event_id, event_type, body FROM webhook_deliveries WHERE tenant_id IN ($1, $2)",
        HOOKED,
        QUIET,
    )
    events = {r["id"]: r for r in logged}
    assert sorted((d["endpoint_id"] == opened, events[d["event_id"]]["notification_id"].int - 1) for d in queued) == [
        (False, 0), (False, 2), (False, 4), (True, 0), (True, 4),
    ]  # fmt: skip
    assert all(d["endpoint_id"] in (opened, both) for d in queued), "none to the disabled endpoint"
    for d in queued:
        assert (d["event_type"], d["body"]) == (events[d["event_id"]]["type"], events[d["event_id"]]["body"])


async def test_an_unknown_type_or_a_value_json_cannot_hold_writes_nothing(conn: asyncpg.Connection) -> None:
    await _endpoint(conn, ["notification.opened"])
    good = _event(0, HOOKED, "opened")
    with pytest.raises(ValueError, match=r"notification\.read"):
        await enqueue_events(conn, events=[good, _event(1, HOOKED, "read")])
    nan = WebhookEventIn(
        tenant_id=HOOKED,
        notification_id=None,
        type="notification.opened",
        data={"x": float("nan")},
        occurred_at=AT,
    )
    with pytest.raises(ValueError):
        await enqueue_events(conn, events=[good, nan])
    assert await conn.fetchval("SELECT count(*) FROM webhook_events WHERE tenant_id = $1", HOOKED) == 0


WAITING = "SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted"


@pytest.mark.parametrize(
    "change",
    [
        "UPDATE webhook_endpoints SET enabled = false WHERE id = $1",
        "DELETE FROM webhook_endpoints WHERE id = $1",
    ],
)
async def test_an_enqueue_waits_for_an_endpoint_being_disabled_or_deleted_and_queues_nothing_to_it(
    database_url: str, tenant: TenantInfo, change: str
) -> None:
    """The other half of the lock protocol (``LOCK_ENDPOINT``): an enqueue that comes while the
    endpoint is held to be disabled or deleted waits, then finds it disabled or gone."""
    pool = await create_pool(database_url, size=3)
    try:
        async with pool.acquire() as conn:
            endpoint = await _endpoint(conn, ["notification.opened"], tenant_id=tenant.id)
        async with pool.acquire() as changer, pool.acquire() as enqueuer:
            async with changer.transaction():
                await changer.execute(LOCK_ENDPOINT, endpoint)
                await changer.execute(change, endpoint)

                async def enqueue() -> None:
                    async with enqueuer.transaction():
                        await enqueue_events(enqueuer, events=[_event(0, tenant.id, "opened")])

                queued = asyncio.create_task(enqueue())
                pid = enqueuer.get_server_pid()
                await wait_until(lambda: queued.done() or _waiting(pool, pid), 15, 0.01)
                assert not queued.done(), "the enqueue waited for the endpoint"
            await queued
        assert (
            await pool.fetchval("SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1", endpoint)
            == 0
        )
    finally:
        await pool.close()


async def _waiting(pool: asyncpg.Pool, pid: int) -> bool:
    return bool(await pool.fetchval(WAITING, pid))
