"""What a tenant's webhook replays may add is bounded (``api/webhook_replay.py``): an event already
pending for the endpoint is not queued again, and an endpoint holds at most ``MAX_REPLAY`` pending
replayed deliveries. Before (2026-11-28, a helper's probe), four loops replaying 400 events added
476,400 delivery rows (151 MB) in 10 s; no sender runs here, so everything queued stays pending."""

from __future__ import annotations

import asyncio

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.webhook_replay import MAX_REPLAY
from harness.tenants import TenantInfo
from tests.fixtures.webhooks import emit, log_events, register

OPENED = ["notification.opened"]
SINCE = "2020-01-01T00:00:00Z"


async def _pending(engine: AsyncEngine, endpoint_id: str) -> int:
    async with engine.connect() as conn:
        query = "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = :e AND state = 'pending'"
        return int((await conn.execute(sa.text(query), {"e": endpoint_id})).scalar_one())


async def test_an_event_already_pending_for_the_endpoint_is_not_queued_again(
    local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    endpoint = await register(local, "http://127.0.0.1:9/hooks", OPENED)
    path = f"/v1/webhook-endpoints/{endpoint['id']}"
    await local.patch(path, json={"enabled": False})
    await emit(engine, tenant.id, n=3)  # logged, but no delivery: the endpoint is disabled
    await local.patch(path, json={"enabled": True})
    answers = [(await local.post(f"{path}/replay", json={"since": SINCE})).json() for _ in range(5)]
    assert [a["replayed"] for a in answers] == [3, 0, 0, 0, 0]
    async with engine.connect() as conn:
        event_id = (
            await conn.execute(
                sa.text("SELECT min(id::text) FROM webhook_events WHERE tenant_id = :t"), {"t": tenant.id}
            )
        ).scalar_one()
    one = await local.post(f"{path}/replay", json={"event_id": event_id})
    assert (one.status_code, one.json()["replayed"]) == (202, 0)
    assert await _pending(engine, endpoint["id"]) == 3


async def test_replays_at_once_queue_each_event_once(
    local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    endpoint = await register(local, "http://127.0.0.1:9/hooks", OPENED)
    path = f"/v1/webhook-endpoints/{endpoint['id']}"
    await log_events(engine, tenant.id, 2_000)  # enough that two unserialised replays overlap
    answers = await asyncio.gather(*(local.post(f"{path}/replay", json={"since": SINCE}) for _ in range(8)))
    # One at a time: one queued them all; each other one came after it (nothing left to queue) or
    # during it (refused at once, 409 endpoint_busy, api/webhook_replay.py).
    busy = [a for a in answers if a.status_code == 409]
    assert all(a.json()["error"]["code"] == "endpoint_busy" for a in busy), [a.text for a in busy]
    replayed = sorted(a.json()["replayed"] for a in answers if a.status_code == 202)
    assert replayed == [0] * (7 - len(busy)) + [2_000], [a.text for a in answers]
    assert await _pending(engine, endpoint["id"]) == 2_000


async def test_an_endpoint_holds_at_most_max_replay_pending_replays(
    local: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    endpoint = await register(local, "http://127.0.0.1:9/hooks", OPENED)
    path = f"/v1/webhook-endpoints/{endpoint['id']}"
    await log_events(engine, tenant.id, MAX_REPLAY + 10)
    first = await local.post(f"{path}/replay", json={"since": SINCE})
    assert first.json()["replayed"] == MAX_REPLAY and first.json()["next_since"] is not None
    again = await local.post(f"{path}/replay", json={"since": first.json()["next_since"]})
    assert again.status_code == 409 and again.json()["error"]["code"] == "replay_backlog", again.text
    assert await _pending(engine, endpoint["id"]) == MAX_REPLAY
