"""Engagement reported to the API: by a tenant's backend (``POST /v1/notifications/{id}/events``, API
key with ``send``) and by a device (``POST /v1/device/events`` with the push's token). Idempotent,
never touching the delivery status, shown by ``GET /v1/notifications/{id}``, and every hostile
input refused with a 4xx and nothing stored."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.engagement import MAX_LINKS
from clarion.engagement_tokens import make_engagement_token
from clarion.settings import Settings
from core.engagement import SEEN_KEPT
from harness.services import ApiServer, api_client
from tests.conftest import METRICS_TOKEN, TenantInfo, make_tenant
from tests.fixtures.answers import assert_error, refused, scrape
from tests.fixtures.hooks import sent_notification, view

LINK = "https://shop.example.com/orders/42?utm_source=push"


def events_url(nid: str) -> str:
    return f"/v1/notifications/{nid}/events"


def device_token(settings: Settings, tenant_id: str, nid: str, *, ttl_s: float = 600, **kw: Any) -> str:
    return make_engagement_token(
        secret=settings.secret_key.get_secret_value(),
        tenant_id=tenant_id,
        notification_id=uuid.UUID(nid),
        ttl_s=ttl_s,
        **kw,
    )


async def rows(engine: AsyncEngine, nid: str) -> list[tuple[str, str, int]]:
    async with engine.connect() as conn:
        result = await conn.execute(
            sa.text(
                "SELECT type, link, count FROM engagement WHERE notification_id = :n ORDER BY type, link"
            ),
            {"n": nid},
        )
        return [tuple(r) for r in result]  # type: ignore[misc]


# --- the tenant's backend ------------------------------------------------------------------------


async def test_an_open_reported_twice_is_counted_once_and_shown_beside_the_unchanged_status(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    first = await client.post(events_url(nid), json={"type": "opened"})
    again = await client.post(events_url(nid), json={"type": "opened"})

    assert first.status_code == 200, first.text
    assert first.json()["duplicate"] is False and first.json()["count"] == 1
    assert again.status_code == 200 and again.json()["duplicate"] is True and again.json()["count"] == 1
    body = await view(client, nid)
    assert body["status"] == "sent" and [h["status"] for h in body["history"]] == ["accepted", "sent"]
    [opened] = body["engagement"]
    assert opened["type"] == "opened" and opened["count"] == 1 and opened["link"] is None
    assert opened["source"] == "api" and opened["first_at"] == opened["last_at"]


async def test_reports_at_distinct_times_count_and_widen_first_and_last(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    async with engine.begin() as conn:  # sent an hour ago
        await conn.execute(
            sa.text("UPDATE notifications SET created_at = now() - interval '1 hour' WHERE id = :n"),
            {"n": nid},
        )
    now = datetime.now(UTC)
    later, earlier = (now - timedelta(seconds=5)).isoformat(), (now - timedelta(seconds=50)).isoformat()
    for at in (later, earlier, later):  # the third repeats the first: not counted
        response = await client.post(events_url(nid), json={"type": "opened", "occurred_at": at})
        assert response.status_code == 200, response.text

    [opened] = (await view(client, nid))["engagement"]
    assert opened["count"] == 2
    assert opened["first_at"] < opened["last_at"]


async def test_a_time_in_the_future_or_before_the_send_is_kept_within_them(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    created = datetime.fromisoformat((await view(client, nid))["created_at"])
    for at in ("2999-01-01T00:00:00Z", "1970-01-02T00:00:00+05:00"):
        response = await client.post(events_url(nid), json={"type": "opened", "occurred_at": at})
        assert response.status_code == 200, response.text
    [opened] = (await view(client, nid))["engagement"]
    assert datetime.fromisoformat(opened["first_at"]) == created
    assert datetime.fromisoformat(opened["last_at"]) <= datetime.now(UTC)


async def test_clicks_are_kept_per_link(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="email")
    for link in (LINK, LINK, "myapp://orders/42"):
        at = datetime.now(UTC).isoformat()  # distinct reports of the same link
        assert (
            await client.post(events_url(nid), json={"type": "clicked", "link": link, "occurred_at": at})
        ).status_code == 200
    assert await rows(engine, nid) == [("clicked", LINK, 2), ("clicked", "myapp://orders/42", 1)]
    shown = {(e["link"], e["count"]) for e in (await view(client, nid))["engagement"]}
    assert shown == {(LINK, 2), ("myapp://orders/42", 1)}


async def test_another_tenants_or_an_unknown_notification_is_404_and_nothing_is_stored(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    other = await make_tenant(engine)
    theirs, _ = await sent_notification(engine, other, channel="push")
    assert_error(await client.post(events_url(theirs), json={"type": "opened"}), 404, "not_found")
    assert_error(await client.post(events_url(str(uuid.uuid4())), json={"type": "opened"}), 404, "not_found")
    assert await rows(engine, theirs) == []


async def test_a_key_without_the_send_scope_is_refused(api: ApiServer, engine: AsyncEngine) -> None:
    reader = await make_tenant(engine, scopes=("read",))
    nid, _ = await sent_notification(engine, reader, channel="push")
    async with api_client(api.url, reader.key) as c:
        assert_error(await c.post(events_url(nid), json={"type": "opened"}), 403, "forbidden")
    async with api_client(api.url, None) as c:
        refused(await c.post(events_url(nid), json={"type": "opened"}), 401)
    assert await rows(engine, nid) == []


DEEP = '{"type": "opened", "x": ' + "[" * 30_000 + "]" * 30_000 + "}"  # within the body limit


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"{not json", 400),
        (DEEP.encode(), 400),
        (b'"opened"', 422),
        (b"{}", 422),
        (b'{"type": "delivered"}', 422),  # providers report deliveries, not the API
        (b'{"type": "bounced"}', 422),
        (b'{"type": ["opened"]}', 422),
        (b'{"type": "opened", "link": "https://example.com"}', 422),  # a link goes with clicked
        (b'{"type": "clicked", "link": "not a url"}', 422),
        (b'{"type": "clicked", "link": "javascript"}', 422),
        (b'{"type": "clicked", "link": "https://example.com/\\u0000"}', 422),
        ('{"type": "clicked", "link": "https://example.com/é"}'.encode(), 422),
        (b'{"type": "clicked", "link": "https://example.com/\\ud800"}', 422),
        (('{"type": "clicked", "link": "https://e.com/' + "a" * 2048 + '"}').encode(), 422),
        (b'{"type": "opened", "occurred_at": "yesterday"}', 422),
        (b'{"type": "opened", "occurred_at": "2026-01-01T00:00:00"}', 422),  # no time zone
        (b'{"type": "opened", "occurred_at": 1700000000}', 422),
        (b'{"type": "opened", "count": 1000}', 422),
        (('{"type": "opened", "pad": "' + "x" * 70_000 + '"}').encode(), 413),
    ],
)
async def test_hostile_bodies_are_refused_and_nothing_is_stored(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, body: bytes, status: int
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    response = await client.post(events_url(nid), content=body, headers={"Content-Type": "application/json"})
    refused(response, status)
    assert await rows(engine, nid) == []


async def test_a_body_not_sent_as_json_is_415(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    response = await client.post(
        events_url(nid), content=b"type=opened", headers={"Content-Type": "text/plain"}
    )
    assert_error(response, 415, "unsupported_media_type")


async def test_clicks_on_more_distinct_links_than_the_cap_are_refused(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    async with engine.begin() as conn:  # the cap's worth of links, straight in
        await conn.execute(
            sa.text(
                "INSERT INTO engagement (notification_id, type, link, tenant_id, notification_created_at,"
                " first_at, last_at, source) SELECT n.id, 'clicked', 'https://e.com/' || i, n.tenant_id,"
                " n.created_at, now(), now(), 'api' FROM notifications n, generate_series(1, :cap) i"
                " WHERE n.id = :n"
            ),
            {"n": nid, "cap": MAX_LINKS},
        )
    assert_error(
        await client.post(events_url(nid), json={"type": "clicked", "link": "https://e.com/new"}),
        422,
        "too_many_links",
    )
    again = await client.post(events_url(nid), json={"type": "clicked", "link": "https://e.com/1"})
    assert again.status_code == 200 and again.json()["count"] == 2  # a known link still counts


# --- the device ----------------------------------------------------------------------------------


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


async def test_engagement_goes_with_its_notification(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    assert (await client.post(events_url(nid), json={"type": "opened"})).status_code == 200
    async with engine.begin() as conn:
        await conn.execute(sa.text("DELETE FROM notifications WHERE id = :n"), {"n": nid})
    assert await rows(engine, nid) == []


async def test_counted_events_are_in_the_metric_by_channel_and_type(
    api: ApiServer, client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    async with api_client(api.url, METRICS_TOKEN) as scraper:
        before = scrape(
            (await scraper.get("/metrics")).text,
            "clarion_engagement_events_total",
            channel="push",
            type="opened",
        )
        nid, _ = await sent_notification(engine, tenant, channel="push")
        await client.post(events_url(nid), json={"type": "opened"})
        await client.post(events_url(nid), json={"type": "opened"})  # a repeat: not counted
        after = scrape(
            (await scraper.get("/metrics")).text,
            "clarion_engagement_events_total",
            channel="push",
            type="opened",
        )
    assert after - before == 1


async def test_the_same_report_sent_concurrently_is_counted_once(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    answers = await asyncio.gather(
        *(client.post(events_url(nid), json={"type": "opened"}) for _ in range(10))
    )
    assert [a.status_code for a in answers] == [200] * 10
    assert sum(not a.json()["duplicate"] for a in answers) == 1
    assert await rows(engine, nid) == [("opened", "", 1)]


async def test_the_replay_markers_a_row_keeps_are_bounded(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    async with engine.begin() as conn:  # sent an hour ago, so 80 distinct times fit after it
        await conn.execute(
            sa.text("UPDATE notifications SET created_at = now() - interval '1 hour' WHERE id = :n"),
            {"n": nid},
        )
    start = datetime.now(UTC) - timedelta(minutes=30)
    for i in range(SEEN_KEPT + 16):
        at = (start + timedelta(seconds=i)).isoformat()
        assert (
            await client.post(events_url(nid), json={"type": "opened", "occurred_at": at})
        ).status_code == 200
    async with engine.connect() as conn:
        count, kept = (
            await conn.execute(
                sa.text("SELECT count, cardinality(seen) FROM engagement WHERE notification_id = :n"),
                {"n": nid},
            )
        ).one()
    assert (count, kept) == (SEEN_KEPT + 16, SEEN_KEPT)
    latest = (start + timedelta(seconds=SEEN_KEPT + 15)).isoformat()
    again = await client.post(events_url(nid), json={"type": "opened", "occurred_at": latest})
    assert again.json()["duplicate"] is True  # the latest replays are still recognised
