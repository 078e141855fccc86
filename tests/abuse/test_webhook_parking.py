"""A delivery queued for an endpoint while it is being disabled or deleted ends parked or cancelled,
never due. ``clarion webhooks``' claim reads past every due delivery of an endpoint that is not
enabled (``workers/webhook_claim.py``), so such rows cost every claim of every tenant.

Before (2026-11-29, a helper's probe): the replay, the worker's record and the sender read the
endpoint without a lock, so a ``DELETE`` or ``PATCH {"enabled": false}`` committed while one of them
was queueing cancelled or parked everything but what it was queueing. Ten loops of register, replay
10,000 events, delete left 100,000 due deliveries of deleted endpoints in 1.9 s (each cycle 10,000
more, without bound: the replay cap is per endpoint); every claim then took 94 ms instead of 1.8 ms,
and another tenant's webhook deliveries took 594 ms at the median instead of 13 ms.

Each test makes the race certain, not likely: the queueing transaction is held open at the point
where the endpoint was already read, then the endpoint is deleted or disabled. A replay and a
change of its endpoint never wait for each other: the second is refused (409 ``endpoint_busy``).
Waiting held one of the API's pooled connections each: 40 replays of one endpoint at once, three
times, took another tenant's ``PUT /v1/users`` p99 from 25 ms to 6.4 s (a helper's probe)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from clarion.pg import create_pool
from clarion.settings import Settings
from core.webhook_events import WebhookEventIn, enqueue_events
from harness.services import wait_until
from harness.tenants import TenantInfo
from tests.fixtures.webhook_receiver import Receiver
from tests.fixtures.webhooks import fast, log_events, register
from workers.webhook_claim import claim
from workers.webhook_record import record_result
from workers.webhook_send import CallResult

OPENED = ["notification.opened"]
SINCE = "2020-01-01T00:00:00Z"

DUE = """
SELECT count(*) FROM webhook_deliveries
 WHERE endpoint_id = :e AND state = 'pending' AND next_attempt_at <= now() + interval '1 day'
"""
# A backend of this database waiting for a lock (the endpoint's row, or the replay's advisory lock).
WAITING = """
SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE NOT l.granted AND l.locktype = :kind AND a.datname = current_database()
"""


async def _due(engine: AsyncEngine, endpoint_id: str) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(sa.text(DUE), {"e": endpoint_id})).scalar_one())


async def _waiting(engine: AsyncEngine, kind: str, at_least: int = 1) -> bool:
    async with engine.connect() as conn:
        return int((await conn.execute(sa.text(WAITING), {"kind": kind})).scalar_one()) >= at_least


async def _done_or_waiting(engine: AsyncEngine, task: asyncio.Task[Any]) -> bool:
    """The request ended, or it waits on a row lock (a tuple or a transaction id)."""
    return task.done() or await _waiting(engine, "transactionid") or await _waiting(engine, "tuple")


async def _changed_while_a_replay_is_in_flight(
    local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, change: str
) -> None:
    """With the endpoint's replay lock held (``api/webhook_replay.py``: as a replay queueing its
    deliveries holds it), another replay and the delete or disable are refused at once, changing
    nothing; once it is released, the replay queues and the change settles all it queued."""
    endpoint = await register(local, "http://127.0.0.1:9/hooks", OPENED)
    path = f"/v1/webhook-endpoints/{endpoint['id']}"
    await log_events(engine, tenant.id, 50)

    async def changed() -> httpx.Response:
        if change == "delete":
            return await local.delete(path)
        return await local.patch(path, json={"enabled": False})

    key = f"webhook-replay:{tenant.id}:{endpoint['id']}"
    async with engine.connect() as holder:
        await holder.execute(sa.text("SELECT pg_advisory_lock(hashtextextended(:k, 0))"), {"k": key})
        # Answered without waiting for the lock (a wait held a pooled connection per request).
        async with asyncio.timeout(10):
            busy = [await local.post(f"{path}/replay", json={"since": SINCE}), await changed()]
        await holder.execute(sa.text("SELECT pg_advisory_unlock(hashtextextended(:k, 0))"), {"k": key})
    for answer in busy:
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "endpoint_busy", answer.text
        assert answer.headers["retry-after"] == "1"
    assert (await local.get(path)).json()["enabled"] is True, "the refused change changed nothing"
    replayed = await local.post(f"{path}/replay", json={"since": SINCE})
    assert replayed.status_code == 202 and replayed.json()["replayed"] == 50, replayed.text
    assert await _due(engine, endpoint["id"]) == 50
    assert (await changed()).status_code in (200, 204)
    assert await _due(engine, endpoint["id"]) == 0


async def test_a_replay_in_flight_refuses_the_endpoints_deletion_and_leaves_nothing_due(
    local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    await _changed_while_a_replay_is_in_flight(local, engine, tenant, "delete")


async def test_a_replay_in_flight_refuses_the_endpoints_disabling_then_its_deliveries_are_parked(
    local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    await _changed_while_a_replay_is_in_flight(local, engine, tenant, "disable")


async def _enqueue(conn: AsyncConnection, tenant_id: str) -> None:
    event = WebhookEventIn(
        tenant_id=tenant_id,
        notification_id=None,
        type="notification.opened",
        data={},
        occurred_at=datetime.now(UTC),
    )
    await enqueue_events(conn, events=[event] * 20)


async def test_events_queued_as_the_endpoint_is_deleted_are_not_left_due(
    local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    """The worker's record (and an engagement report) queue deliveries in their own transaction."""
    endpoint = await register(local, "http://127.0.0.1:9/hooks", OPENED)
    async with engine.connect() as conn:
        transaction = await conn.begin()
        await _enqueue(conn, tenant.id)
        deleted = asyncio.create_task(local.delete(f"/v1/webhook-endpoints/{endpoint['id']}"))
        await wait_until(lambda: _done_or_waiting(engine, deleted), 15, 0.01)
        await transaction.commit()
    assert (await deleted).status_code == 204
    assert await _due(engine, endpoint["id"]) == 0


async def test_events_queued_as_the_endpoint_is_disabled_are_parked(
    local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    endpoint = await register(local, "http://127.0.0.1:9/hooks", OPENED)
    path = f"/v1/webhook-endpoints/{endpoint['id']}"
    async with engine.connect() as conn:
        transaction = await conn.begin()
        await _enqueue(conn, tenant.id)
        disabled = asyncio.create_task(local.patch(path, json={"enabled": False}))
        await wait_until(lambda: _done_or_waiting(engine, disabled), 15, 0.01)
        await transaction.commit()
    assert (await disabled).status_code == 200
    assert await _due(engine, endpoint["id"]) == 0
    enabled = await local.patch(path, json={"enabled": True})  # and enabling sends them after all
    assert enabled.status_code == 200
    assert await _due(engine, endpoint["id"]) == 20


async def test_a_call_that_fails_after_its_endpoint_was_disabled_leaves_the_delivery_parked(
    settings: Settings, local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    receiver = await Receiver().start()
    try:
        endpoint = await register(local, receiver.url, OPENED)
        async with engine.begin() as conn:
            await _enqueue(conn, tenant.id)
        policy = fast(settings).policy
        pool = await create_pool(settings.database_url, size=2)
        try:
            # The session's database holds other tests' due deliveries: take this tenant's alone.
            others = {t: 1_000 for t in await _tenants_with_pending(pool, but=tenant.id)}
            mine = await claim(pool=pool, limit=20, lease_s=60, per_tenant=20, busy=others)
            assert len(mine) == 20
            path = f"/v1/webhook-endpoints/{endpoint['id']}"
            assert (await local.patch(path, json={"enabled": False})).status_code == 200
            for delivery in mine[:10]:  # the calls in flight as it was disabled end now
                failed = CallResult(ok=False, status=503, error="answered HTTP 503", retry_after_s=1.0)
                await record_result(pool=pool, delivery=delivery, result=failed, policy=policy)
        finally:
            await pool.close()
        assert await _due(engine, endpoint["id"]) == 0
    finally:
        await receiver.stop()


async def _tenants_with_pending(pool: asyncpg.Pool, *, but: str) -> list[str]:
    rows = await pool.fetch(
        "SELECT DISTINCT tenant_id FROM webhook_deliveries WHERE state = 'pending' AND tenant_id <> $1", but
    )
    return [r["tenant_id"] for r in rows]


async def test_events_queued_as_clarion_disables_the_endpoint_are_parked(
    settings: Settings, local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    """Clarion's own disabling (the failure streak, ``workers/webhook_record.py``) waits for the
    deliveries being queued to the endpoint, as the tenant's does. Before, it took the endpoint
    ``FOR NO KEY UPDATE``, which an enqueue's ``FOR KEY SHARE`` never waits for nor holds off:
    what a worker's record was queueing meanwhile committed due for a disabled endpoint."""
    endpoint = await register(local, "http://127.0.0.1:9/hooks", OPENED)
    async with engine.begin() as conn:
        await _enqueue(conn, tenant.id)
    policy = replace(fast(settings).policy, disable_after_failures=1, disable_after_s=0.0)
    pool = await create_pool(settings.database_url, size=2)
    try:
        others = {t: 1_000 for t in await _tenants_with_pending(pool, but=tenant.id)}
        [failing, *_] = await claim(pool=pool, limit=20, lease_s=60, per_tenant=20, busy=others)
        async with engine.connect() as conn:
            transaction = await conn.begin()
            await _enqueue(conn, tenant.id)  # queued to the endpoint, not committed yet
            failed = CallResult(ok=False, status=500, error="answered HTTP 500")
            recorded = asyncio.create_task(
                record_result(pool=pool, delivery=failing, result=failed, policy=policy)
            )
            await wait_until(lambda: _done_or_waiting(engine, recorded), 15, 0.01)
            await transaction.commit()
        assert await recorded is True  # this failure disabled the endpoint
    finally:
        await pool.close()
    body = (await local.get(f"/v1/webhook-endpoints/{endpoint['id']}")).json()
    assert body["enabled"] is False and "1 consecutive failed" in body["disabled_reason"]
    assert await _due(engine, endpoint["id"]) == 0


# The replay's statement waiting for webhook_events (its CTE reads the events to queue).
REPLAY_WAITING = """
SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE NOT l.granted AND l.locktype = 'relation' AND a.datname = current_database()
   AND a.query LIKE '%WITH candidates AS%'
"""


async def test_a_replay_in_flight_as_clarion_disables_the_endpoint_ends_parked(
    settings: Settings, local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    """A replay reads its endpoint ``FOR KEY SHARE``: Clarion's disable waits for it to commit, then
    parks what it queued. Before, a replay that had read the endpoint enabled queued its events
    (up to 10,000) after the disable had parked, all due for a disabled endpoint."""
    endpoint = await register(local, "http://127.0.0.1:9/hooks", OPENED)
    path = f"/v1/webhook-endpoints/{endpoint['id']}"
    async with engine.begin() as conn:
        await _enqueue(conn, tenant.id)
    await log_events(engine, tenant.id, 50)
    policy = replace(fast(settings).policy, disable_after_failures=1, disable_after_s=0.0)
    pool = await create_pool(settings.database_url, size=2)
    try:
        others = {t: 1_000 for t in await _tenants_with_pending(pool, but=tenant.id)}
        [failing, *_] = await claim(pool=pool, limit=20, lease_s=60, per_tenant=20, busy=others)
        async with engine.connect() as holder:
            transaction = await holder.begin()
            # The replay stops once it has read its endpoint, where it reads the events to queue.
            await holder.execute(sa.text("LOCK TABLE webhook_events IN ACCESS EXCLUSIVE MODE"))
            replayed = asyncio.create_task(local.post(f"{path}/replay", json={"since": SINCE}))
            await wait_until(lambda: replayed.done() or _counted(engine, REPLAY_WAITING), 15, 0.01)
            failed = CallResult(ok=False, status=500, error="answered HTTP 500")
            recorded = asyncio.create_task(
                record_result(pool=pool, delivery=failing, result=failed, policy=policy)
            )
            await wait_until(lambda: _done_or_waiting(engine, recorded), 15, 0.01)
            await transaction.commit()
        answer = await replayed
        assert await recorded is True
    finally:
        await pool.close()
    assert answer.status_code == 202 and answer.json()["replayed"] == 50, answer.text
    assert (await local.get(path)).json()["enabled"] is False
    assert await _due(engine, endpoint["id"]) == 0


async def _counted(engine: AsyncEngine, sql: str) -> bool:
    async with engine.connect() as conn:
        return int((await conn.execute(sa.text(sql))).scalar_one()) > 0
