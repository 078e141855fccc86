"""Provider reports feed engagement: Twilio delivered/undelivered, SendGrid delivered, bounce, open,
click (with its url), unsubscribe, group_unsubscribe and spamreport; a replayed callback or batch
changes no count, and the delivery status and its history keep what they had."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.settings import Settings
from tests.conftest import TenantInfo
from tests.fixtures.hooks import Hooks, callback, event, hooked_api, sent_notification, view


@pytest.fixture(scope="module")
async def hooks(settings: Settings) -> AsyncIterator[Hooks]:
    async with hooked_api(settings) as h:
        yield h


def engagement(body: dict[str, Any]) -> dict[tuple[str, str | None], int]:
    return {(e["type"], e["link"]): e["count"] for e in body["engagement"]}


async def test_twilio_delivered_is_engagement_once_across_replays(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, _ = await sent_notification(
        engine, tenant, channel="sms", provider_message_id="SMeng1" + nid_suffix()
    )
    sid = (await view(client, nid))["provider_message_id"]
    for _ in range(3):  # Twilio retries a callback it thinks failed
        assert (await hooks.twilio(callback(sid, "delivered"))).status_code == 200
    body = await view(client, nid)
    assert engagement(body) == {("delivered", None): 1}
    assert body["engagement"][0]["source"] == "twilio" and body["status"] == "sent"


async def test_twilio_undelivered_is_a_bounce(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    sid = "SMeng2" + nid_suffix()
    nid, _ = await sent_notification(engine, tenant, channel="sms", provider_message_id=sid)
    assert (await hooks.twilio(callback(sid, "undelivered", ErrorCode="30005"))).status_code == 200
    assert (await hooks.twilio(callback(sid, "delivered"))).status_code == 200  # late: changes nothing
    assert engagement(await view(client, nid)) == {("bounced", None): 1}


async def test_every_sendgrid_event_type_lands_on_its_engagement_row_and_replays_do_not_count(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    email = f"{external_id}@example.com"
    url = "https://shop.example.com/orders/42"
    batch = [
        event(nid, "processed", email),
        event(nid, "delivered", email, response="250 OK"),
        event(nid, "open", email),
        event(nid, "open", email),  # a second open: counted
        event(nid, "click", email, url=url),
        event(nid, "click", email, url="https://shop.example.com/help"),
        event(nid, "group_unsubscribe", email, asm_group_id=7),
        event(nid, "spamreport", email),
    ]
    first = await hooks.events(batch)
    replay = await hooks.events(batch)  # SendGrid retries the whole batch

    assert first.status_code == 200 and first.json()["recorded"] == 7
    assert replay.status_code == 200 and replay.json()["recorded"] == 0 and replay.json()["duplicate"] == 7
    body = await view(client, nid)
    assert engagement(body) == {
        ("delivered", None): 1,
        ("opened", None): 2,
        ("clicked", url): 1,
        ("clicked", "https://shop.example.com/help"): 1,
        ("unsubscribed", None): 1,
        ("complained", None): 1,
    }
    assert {e["source"] for e in body["engagement"]} == {"sendgrid"}
    # opens and clicks say nothing about delivery: the status history does not grow with them
    statuses = [h["status"] for h in body["history"]]
    assert "open" not in statuses and "click" not in statuses and body["status"] == "sent"


async def test_a_bounce_is_engagement_and_an_open_after_it_does_not_regress_the_status(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    email = f"{external_id}@example.com"
    await hooks.events([event(nid, "bounce", email, type="bounce", reason="550 no such user")])
    await hooks.events([event(nid, "open", email)])
    body = await view(client, nid)
    assert engagement(body) == {("bounced", None): 1, ("opened", None): 1}
    assert body["status"] == "sent" and body["history"][-1]["status"] == "bounce"


async def test_the_event_time_is_sendgrids_kept_within_the_send_and_now(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    email = f"{external_id}@example.com"
    await hooks.events([event(nid, "open", email, timestamp=int(time.time()) + 10**9)])
    await hooks.events([event(nid, "open", email, timestamp=0)])
    await hooks.events([event(nid, "open", email, timestamp="not a time")])
    body = await view(client, nid)
    [opened] = body["engagement"]
    assert opened["count"] == 3 and opened["first_at"] == body["created_at"]


async def test_a_huge_click_url_is_cut_not_refused(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    url = "https://e.com/" + "é" * 5000
    response = await hooks.events([event(nid, "click", f"{external_id}@example.com", url=url)])
    assert response.status_code == 200 and response.json()["recorded"] == 1
    [clicked] = (await view(client, nid))["engagement"]
    assert url.startswith(clicked["link"]) and len(clicked["link"].encode()) <= 2048


def nid_suffix() -> str:
    return str(time.time_ns())
