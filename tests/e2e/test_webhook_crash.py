"""A ``clarion webhooks`` process SIGKILLed mid-delivery loses no event: another process sends
what it held once the lease ends (the receiver sees that one twice, and can tell by webhook-id)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from clarion.settings import Settings
from harness.services import ApiServer, ClarionProcess, drop_database, fresh_database, wait_until
from harness.tenants import make_tenant
from tests.fixtures.webhook_receiver import Receiver
from tests.fixtures.webhooks import allow_local, emit, register

EVENTS = 30
SENDER_ENV = {
    "CLARION_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
    "CLARION_WEBHOOK_LEASE_S": "10",  # the shortest a 3 s call allows (clarion.settings)
    "CLARION_WEBHOOK_TIMEOUT_S": "3",  # the held call is still in flight when the process dies
    "CLARION_WEBHOOK_RETRY_BASE_S": "0.2",
    "CLARION_WEBHOOK_POLL_INTERVAL_S": "0.1",
    "CLARION_WEBHOOK_CONCURRENCY": "4",
}


@pytest.fixture
async def isolated(settings: Settings) -> AsyncIterator[Settings]:
    """A database of this test's own: the processes it kills touch nothing of other tests."""
    url = await fresh_database("clarion_webhooks_crash")
    yield allow_local(settings.model_copy(update={"database_url": url}))
    await drop_database(url)


async def _states(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = (
            await conn.execute(sa.text("SELECT state, count(*) FROM webhook_deliveries GROUP BY state"))
        ).all()
    return {r[0]: r[1] for r in rows}


async def test_a_sender_killed_mid_delivery_loses_no_event(isolated: Settings) -> None:
    engine = create_async_engine(isolated.database_url)
    api = ApiServer(isolated)
    receiver = await Receiver().start()
    first = ClarionProcess(isolated, "webhooks", extra_env=SENDER_ENV)
    second = ClarionProcess(isolated, "webhooks", extra_env=SENDER_ENV)
    await api.start()
    try:
        tenant = await make_tenant(engine)
        async with httpx.AsyncClient(
            base_url=api.url, headers={"Authorization": f"Bearer {tenant.key}"}, timeout=15
        ) as client:
            created = await register(client, receiver.url, ["notification.opened"])
        receiver.secrets = [created["secret"]]
        receiver.slow_next = 1  # the first call is taken in and never answered
        await emit(engine, tenant.id, n=EVENTS)
        first.start()
        await wait_until(lambda: receiver.held == 1, 30)
        first.kill()  # SIGKILL while that call is in flight
        second.start()
        await wait_until(lambda: len(receiver.counts()) == EVENTS, 60)
        states = await wait_until(lambda: _delivered_all(engine), 30)
    finally:
        first.kill()
        second.kill()
        await receiver.stop()
        await api.stop()
        await engine.dispose()
    assert states == {"delivered": EVENTS}
    assert receiver.unverified == 0
    assert receiver.duplicates() >= 1  # the held one, sent again after its lease


async def _delivered_all(engine: AsyncEngine) -> dict[str, int] | None:
    states = await _states(engine)
    return states if states == {"delivered": EVENTS} else None
