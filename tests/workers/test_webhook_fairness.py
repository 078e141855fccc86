"""One tenant's endpoints that hang hold at most that tenant's share of the sender's calls
(``CLARION_WEBHOOK_CONCURRENCY_PER_TENANT``): another tenant's delivery goes out while they hang.
Before the share, the oldest due deliveries took every call slot whoever they belonged to."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.settings import Settings
from harness.services import ApiServer, api_client, wait_until
from harness.tenants import make_tenant
from tests.fixtures.webhook_receiver import Receiver
from tests.fixtures.webhooks import disable_tenant_endpoints, emit, fast, register, sender

SLOTS, SHARE = 4, 2


@pytest.fixture
async def receivers() -> AsyncIterator[tuple[Receiver, Receiver]]:
    hanging, healthy = await Receiver().start(), await Receiver().start()
    yield hanging, healthy
    await hanging.stop()
    await healthy.stop()


async def _endpoint(api: ApiServer, key: str, receiver: Receiver) -> None:
    async with api_client(api.url, key) as client:
        created = await register(client, receiver.url, ["notification.opened"])
    receiver.secrets = [created["secret"]]


async def test_a_tenant_whose_endpoint_hangs_holds_only_its_share_of_the_calls(
    settings: Settings,
    engine: AsyncEngine,
    local_api: ApiServer,
    receivers: tuple[Receiver, Receiver],
) -> None:
    hanging, healthy = receivers
    a, b = await make_tenant(engine), await make_tenant(engine)
    await _endpoint(local_api, a.key, hanging)
    await _endpoint(local_api, b.key, healthy)
    hanging.hang_next = 1_000  # every call held until the receiver stops
    await emit(engine, a.id, n=20)  # due first: the oldest deliveries are all A's
    await emit(engine, b.id, n=1)
    try:
        delivery = fast(settings, concurrency=SLOTS, per_tenant=SHARE, timeout_s=60.0, lease_s=120.0)
        async with sender(settings, delivery):
            await wait_until(lambda: healthy.of_type("notification.opened"), 15)
            await wait_until(lambda: hanging.held == SHARE, 15)
            assert hanging.calls == SHARE  # A's share, every call still hanging, and no more taken
    finally:
        await disable_tenant_endpoints(engine, a.id)
        await disable_tenant_endpoints(engine, b.id)


def test_the_share_is_what_the_settings_say_and_never_more_than_the_slots(settings: Settings) -> None:
    from commands.runner import delivery_settings

    assert delivery_settings(settings).per_tenant == 4
    wide = settings.model_copy(update={"webhook_concurrency": 2, "webhook_concurrency_per_tenant": 10})
    assert delivery_settings(wide).per_tenant == 2
