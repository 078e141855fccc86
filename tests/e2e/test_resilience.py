"""Nothing accepted is lost: broker outage, worker SIGKILL before and after the provider call.

These run the worker as a separate OS process (``clarion worker email``) so it can be killed for real.
The sandbox provider writes to ``sandbox_messages``; holding a lock in PostgreSQL pins the worker at
the exact point to kill it, with no test hooks in the product.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import httpx
import pytest
from asyncpg.transaction import Transaction
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.broker import TansuBroker
from clarion.kafka import create_topics
from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from harness.services import ApiServer, ClarionProcess, drop_database, fresh_database, wait_until
from tests.conftest import make_tenant
from tests.fixtures.delivery import sandbox_for, status_of, wait_status
from tests.fixtures.sends import email_send


@pytest.fixture
async def own_broker() -> AsyncIterator[TansuBroker]:
    broker = TansuBroker()
    broker.start()
    await create_topics(broker.bootstrap, partitions=1)
    yield broker
    broker.stop()


@pytest.fixture
async def isolated(settings: Settings, own_broker: TansuBroker) -> AsyncIterator[Settings]:
    """A database and broker of this test's own, so killing processes cannot disturb other tests."""
    url = await fresh_database("clarion_resilience")
    yield settings.model_copy(
        update={"database_url": url, "kafka_bootstrap": own_broker.bootstrap, "lease_s": 2.0}
    )
    await drop_database(url)


async def test_send_while_broker_is_down_is_delivered_after_it_returns(
    isolated: Settings, own_broker: TansuBroker
) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine: AsyncEngine = create_async_engine(isolated.database_url)
    tenant = await make_tenant(engine)
    api = ApiServer(isolated)
    worker = ClarionProcess(isolated, "worker", "email")
    relay = ClarionProcess(isolated, "relay")
    await api.start()
    worker.start()
    relay.start()
    try:
        async with httpx.AsyncClient(
            base_url=api.url, headers={"Authorization": f"Bearer {tenant.key}"}, timeout=20
        ) as client:
            first = (await client.post("/v1/notifications", json=email_send())).json()["id"]
            await wait_status(client, first, "sent", 30)
            # The broker dies and comes back empty (memory storage), on the same port.
            own_broker.stop()
            during = await client.post("/v1/notifications", json=email_send())
            assert during.status_code == 202, during.text
            nid = during.json()["id"]
            await asyncio.sleep(1.5)  # what is tested is that nothing moves while it is down: not pollable
            assert (await status_of(client, nid))["status"] == "accepted"
            own_broker.start()
            body = await wait_status(client, nid, "sent", 60)
            assert body["provider"] == "sandbox"
            assert len(await sandbox_for(client, nid)) == 1
    finally:
        worker.kill()
        relay.kill()
        await api.stop()
        await engine.dispose()


async def _row(conn: asyncpg.Connection, nid: str) -> asyncpg.Record:
    return await conn.fetchrow("SELECT status, attempts FROM notifications WHERE id = $1::uuid", nid)


@dataclass
class Stuck:
    """A send the worker (a separate process) has claimed and is stuck delivering: the sandbox
    provider's write waits on a table lock held in ``lock``."""

    settings: Settings
    client: httpx.AsyncClient
    nid: str
    lock: Transaction
    worker: ClarionProcess

    def restart_worker(self) -> None:
        self.worker = ClarionProcess(self.settings, "worker", "email")
        self.worker.start()


@pytest.fixture
async def stuck(isolated: Settings) -> AsyncIterator[Stuck]:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(isolated.database_url)
    tenant = await make_tenant(engine)
    api = ApiServer(isolated)
    await api.start()
    worker = ClarionProcess(isolated, "worker", "email")
    relay = ClarionProcess(isolated, "relay")
    blocker = await asyncpg.connect(asyncpg_dsn(isolated.database_url))
    state: Stuck | None = None
    try:
        async with httpx.AsyncClient(
            base_url=api.url, headers={"Authorization": f"Bearer {tenant.key}"}, timeout=20
        ) as client:
            # Block the sandbox provider's write: the worker claims, then hangs inside the provider call.
            lock = blocker.transaction()
            await lock.start()
            await blocker.execute("LOCK TABLE sandbox_messages IN SHARE ROW EXCLUSIVE MODE")
            worker.start()
            relay.start()
            nid = (await client.post("/v1/notifications", json=email_send())).json()["id"]
            await wait_until(lambda: _status_is(isolated, nid, "sending"), 30)
            state = Stuck(isolated, client, nid, lock, worker)
            yield state
    finally:
        (state.worker if state is not None else worker).kill()  # the restarted one, if any
        relay.kill()
        await blocker.close()
        await api.stop()
        await engine.dispose()


async def test_worker_killed_after_claim_before_provider_call_delivers_exactly_once(stuck: Stuck) -> None:
    client, nid = stuck.client, stuck.nid
    stuck.worker.kill()
    await stuck.lock.rollback()
    assert (await sandbox_for(client, nid)) == []
    stuck.restart_worker()
    body = await wait_status(client, nid, "sent", 40)
    assert len(await sandbox_for(client, nid)) == 1
    assert [a["outcome"] for a in body["delivery_attempts"]] == ["sent"]


async def _status_is(settings: Settings, nid: str, status: str) -> bool:
    conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
    try:
        return (await _row(conn, nid))["status"] == status
    finally:
        await conn.close()


async def test_worker_killed_after_provider_call_before_record_sends_one_known_duplicate(
    stuck: Stuck,
) -> None:
    """The one window for a duplicate: the provider accepted, the worker died before recording.

    After the lease expires the notification is claimed again and sent a second time. This test
    pins that behaviour: exactly two provider calls, one final `sent` row, never more.
    """
    client, nid = stuck.client, stuck.nid
    # Lock the row so recording blocks, then let the provider call complete.
    row_lock = await asyncpg.connect(asyncpg_dsn(stuck.settings.database_url))
    hold = row_lock.transaction()
    await hold.start()
    await row_lock.execute("SELECT 1 FROM notifications WHERE id = $1::uuid FOR UPDATE", nid)
    await stuck.lock.rollback()  # the provider call completes now; recording waits on the row lock
    await wait_until(lambda: _sandbox_count(stuck.settings, nid), 30)
    stuck.worker.kill()
    await hold.rollback()
    await row_lock.close()
    assert (await status_of(client, nid))["status"] == "sending"
    stuck.restart_worker()
    await wait_status(client, nid, "sent", 40)
    await asyncio.sleep(1.0)  # a third send would come later, if at all: an absence cannot be polled
    assert len(await sandbox_for(client, nid)) == 2, "the known duplicate of the lease window"


async def _sandbox_count(settings: Settings, nid: str) -> int:
    conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
    try:
        return int(
            await conn.fetchval("SELECT count(*) FROM sandbox_messages WHERE notification_id = $1::uuid", nid)
        )
    finally:
        await conn.close()
