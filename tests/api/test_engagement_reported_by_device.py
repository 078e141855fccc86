"""Engagement a device reports (``POST /v1/device/events`` with the push's token, no API key): the
same event as the backend's, tokens of a previous secret honoured, forged or expired ones refused."""

from __future__ import annotations

import time
import uuid

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.engagement_tokens import make_engagement_token
from clarion.settings import Settings
from harness.services import ApiServer, api_client
from tests.conftest import TenantInfo
from tests.fixtures.answers import assert_error, refused
from tests.fixtures.engagement import DEEP, device_token, events_url, flood_behind_a_locked_row, rows
from tests.fixtures.hooks import sent_notification


async def test_a_device_reports_an_open_with_its_token_idempotently(
    api: ApiServer, settings: Settings, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    token = device_token(settings, tenant.id, nid)
    async with api_client(api.url, None) as device:  # no API key on a device
        first = await device.post("/v1/device/events", json={"token": token, "type": "opened"})
        again = await device.post("/v1/device/events", json={"token": token, "type": "opened"})
    assert first.status_code == 200, first.text
    assert first.json()["notification_id"] == nid and first.json()["source"] == "device"
    assert again.json()["duplicate"] is True and again.json()["count"] == 1
    # the backend forwarding the same open later is the same event
    assert (await client.post(events_url(nid), json={"type": "opened"})).json()["duplicate"] is True


async def test_a_token_signed_with_a_previous_secret_still_works(
    settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    rotated = settings.model_copy(
        update={
            "secret_key": settings.secret_key.__class__("rotated-secret"),
            "previous_secret_keys": [settings.secret_key],
        }
    )
    server = ApiServer(rotated)
    await server.start()
    try:
        nid, _ = await sent_notification(engine, tenant, channel="push")
        async with api_client(server.url, None) as device:
            response = await device.post(
                "/v1/device/events", json={"token": device_token(settings, tenant.id, nid), "type": "opened"}
            )
        assert response.status_code == 200, response.text
    finally:
        await server.stop()


async def test_forged_expired_or_missing_tokens_are_refused_and_nothing_is_stored(
    api: ApiServer, settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    genuine = device_token(settings, tenant.id, nid)
    other_tenant = device_token(settings, "someone-else", nid)
    forged = other_tenant.split(".")[0] + "." + genuine.split(".")[1]
    expired = device_token(settings, tenant.id, nid, now_s=time.time() - 3600)
    wrong_secret = make_engagement_token(
        secret="not-the-secret", tenant_id=tenant.id, notification_id=uuid.UUID(nid), ttl_s=600
    )
    async with api_client(api.url, None) as device:
        for token in (forged, expired, wrong_secret, "x", "a.b", genuine[:-2]):
            response = await device.post("/v1/device/events", json={"token": token, "type": "opened"})
            assert_error(response, 403, "invalid_token")
        refused(await device.post("/v1/device/events", json={"type": "opened"}), 422)
        refused(await device.post("/v1/device/events", json={"token": "t" * 600, "type": "opened"}), 422)
        refused(
            await device.post(
                "/v1/device/events", content=b"[", headers={"Content-Type": "application/json"}
            ),
            400,
        )
        refused(
            await device.post(
                "/v1/device/events", content=DEEP.encode(), headers={"Content-Type": "application/json"}
            ),
            400,
        )
    assert await rows(engine, nid) == []


async def test_a_token_for_a_notification_since_deleted_is_404(
    api: ApiServer, settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    token = device_token(settings, tenant.id, str(uuid.uuid4()))
    async with api_client(api.url, None) as device:
        response = await device.post("/v1/device/events", json={"token": token, "type": "opened"})
    assert_error(response, 404, "not_found")


async def test_a_flood_of_one_devices_report_holds_no_more_than_its_share_of_the_pool(
    api: ApiServer, engine: AsyncEngine, tenant: TenantInfo, settings: Settings
) -> None:
    """Anyone holding one push has its token for a month, and every report of it, a replay too,
    locks one engagement row: the reports queued on that lock, each holding a pooled connection the
    accept path shares, and another tenant's sends waited for one (api/engagement_gate.py). The row
    is held locked here so the reports wait inside PostgreSQL, as a flood's do on each other."""
    nid, _ = await sent_notification(engine, tenant, channel="push")
    body = {"token": device_token(settings, tenant.id, nid), "type": "opened"}
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as device:
        assert (await device.post("/v1/device/events", json=body)).status_code == 200

        answers = await flood_behind_a_locked_row(
            settings=settings,
            engine=engine,
            api_url=api.url,
            nid=nid,
            hit=lambda: device.post("/v1/device/events", json=body),
        )

    for answer in answers:
        assert_error(answer, 429, "engagement_busy")
        assert answer.headers["retry-after"] == "1"
