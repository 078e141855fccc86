"""Engagement a tenant's backend reports (``POST /v1/notifications/{id}/events``): idempotent, kept per
link within the send's lifetime, and shown by ``GET /v1/notifications/{id}`` beside the unchanged
delivery status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import TenantInfo
from tests.fixtures.engagement import events_url, rows
from tests.fixtures.hooks import sent_notification, view

LINK = "https://shop.example.com/orders/42?utm_source=push"


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
