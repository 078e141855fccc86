"""Engagement reports the API refuses with a 4xx and nothing stored: another tenant's or an unknown
notification, a key without ``send``, hostile or non-JSON bodies, links past the cap."""

from __future__ import annotations

import uuid

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from core.engagement import MAX_LINKS
from harness.services import ApiServer, api_client
from tests.conftest import TenantInfo, make_tenant
from tests.fixtures.answers import assert_error, refused
from tests.fixtures.engagement import DEEP, events_url, rows
from tests.fixtures.hooks import sent_notification


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
