"""End to end over the real broker: opt-outs, required categories, one-click unsubscribe from the
email's header, quiet hours, locale fallback and template safety."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from harness.services import api_client
from tests.conftest import Stack, TenantInfo
from tests.fixtures.answers import assert_error
from tests.fixtures.db import scalar
from tests.fixtures.delivery import sandbox_for, status_of, wait_status
from tests.fixtures.sends import count_notifications, email_send

USER = {"email": "lin@example.com", "phone": "+14155550142", "locale": "en"}


async def send(client: httpx.AsyncClient, **overrides: Any) -> str:
    body = email_send(user=None, user_id="u-lin", **overrides)
    response = await client.post("/v1/notifications", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def put_user(client: httpx.AsyncClient, **overrides: Any) -> None:
    response = await client.put("/v1/users/u-lin", json={**USER, **overrides})
    assert response.status_code in (200, 201), response.text


async def put_preferences(client: httpx.AsyncClient, *entries: tuple[str, str, bool]) -> None:
    body = {"preferences": [{"channel": c, "category": k, "opted_in": v} for c, k, v in entries]}
    response = await client.put("/v1/users/u-lin/preferences", json=body)
    assert response.status_code == 200, response.text


async def test_opted_out_channel_is_suppressed_and_other_channels_still_sent(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    await put_user(client)
    await put_preferences(client, ("email", "*", False))
    email = await send(client)
    sms = await send(client, channel="sms", template="otp", data={"code": "1234"})

    suppressed = await wait_status(client, email, "suppressed")
    assert suppressed["error"]["code"] == "opted_out"
    assert "channel=email" in suppressed["error"]["message"]
    assert suppressed["delivery_attempts"] == [] and await sandbox_for(client, email) == []
    await wait_status(client, sms, "sent")


async def test_preference_change_applies_to_a_notification_not_yet_sent(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    await put_user(client)
    later = (datetime.now(UTC) + timedelta(seconds=2)).isoformat()
    nid = await send(client, send_at=later)
    assert (await status_of(client, nid))["status"] == "scheduled"
    await put_preferences(client, ("*", "orders", False))
    body = await wait_status(client, nid, "suppressed")
    assert "category=orders" in body["error"]["message"]


async def test_required_category_is_delivered_despite_opt_out_of_everything(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    await put_user(client)
    assert (await client.put("/v1/categories/security", json={"required": True})).status_code == 201
    refused = await client.put(
        "/v1/users/u-lin/preferences",
        json={"preferences": [{"channel": "email", "category": "security", "opted_in": False}]},
    )
    assert_error(refused, 422, "category_required")
    await put_preferences(client, ("*", "*", False))

    alert = await send(client, category="security", priority="critical")
    ordinary = await send(client, category="orders", priority="critical")
    await wait_status(client, alert, "sent")
    await wait_status(client, ordinary, "suppressed")  # critical does not override a plain opt-out
    [message] = await sandbox_for(client, alert)
    assert "unsubscribe_url" not in message["data"]  # nothing to unsubscribe from


async def test_one_click_unsubscribe_from_the_email_header_suppresses_the_next_marketing_email(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    await put_user(client)
    await client.put("/v1/categories/marketing", json={})
    first = await send(client, category="marketing", template="welcome", data={"name": "Lin"})
    await wait_status(client, first, "sent")
    [message] = await sandbox_for(client, first)
    url = urlsplit(message["data"]["unsubscribe_url"])
    assert url.path == "/v1/unsubscribe" and url.query.startswith("token=")

    # What a mail client does for RFC 8058: POST the header's URL, no credentials, fixed body.
    async with api_client(stack.api.url, None) as mail_client:
        opened = await mail_client.get(f"{url.path}?{url.query}")
        assert opened.status_code == 200  # a GET (link scanner) unsubscribes nobody
        again = await send(client, category="marketing", template="welcome", data={"name": "Lin"})
        await wait_status(client, again, "sent")

        response = await mail_client.post(
            f"{url.path}?{url.query}",
            content=b"List-Unsubscribe=One-Click",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert response.status_code == 200, response.text
        forged = await mail_client.post(
            f"{url.path}?{url.query[:-3]}xyz", content=b"List-Unsubscribe=One-Click"
        )
        assert_error(forged, 403, "invalid_token")

    marketing = await send(client, category="marketing", template="welcome", data={"name": "Lin"})
    transactional = await send(client, category="orders")
    body = await wait_status(client, marketing, "suppressed")
    assert body["error"]["code"] == "opted_out" and "category=marketing" in body["error"]["message"]
    await wait_status(client, transactional, "sent")


def _hhmm(moment: datetime) -> str:
    return moment.strftime("%H:%M")


async def test_quiet_hours_hold_sms_until_they_end_and_then_release_it(
    stack: Stack, client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    zone = ZoneInfo("Asia/Kathmandu")  # UTC+05:45
    local = datetime.now(UTC).astimezone(zone)
    start, end = _hhmm(local - timedelta(hours=1)), _hhmm(local + timedelta(hours=2))
    await put_user(client, timezone="Asia/Kathmandu", quiet_hours={"start": start, "end": end})

    held = await send(client, channel="sms", template="otp", data={"code": "1"})
    urgent = await send(client, channel="sms", template="otp", data={"code": "2"}, priority="critical")
    email = await send(client)
    body = await wait_status(client, held, "delayed")
    assert body["error"]["code"] == "quiet_hours"
    await wait_status(client, urgent, "sent")
    await wait_status(client, email, "sent")  # email is not held unless its category says so

    expected_end = (local + timedelta(hours=2)).replace(second=0, microsecond=0).astimezone(UTC)
    not_before = await scalar(engine, "SELECT not_before FROM notifications WHERE id = :i", i=held)
    assert not_before == expected_end

    # The user's night ends (their quiet hours no longer cover now, and the clock reaches
    # not_before): the relay republishes it and it is sent.
    await put_user(client, timezone="Asia/Kathmandu", quiet_hours=None)
    async with engine.begin() as conn:
        await conn.execute(sa.text("UPDATE notifications SET not_before = now() WHERE id = :i"), {"i": held})
    released = await wait_status(client, held, "sent")
    assert [h["status"] for h in released["history"]][-3:] == ["delayed", "sending", "sent"]
    assert (await sandbox_for(client, held))[0]["body"] == "Your code is 1"


async def test_email_held_in_quiet_hours_only_when_its_category_says_so(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    local = datetime.now(UTC)
    await put_user(
        client,
        timezone="UTC",
        quiet_hours={"start": _hhmm(local - timedelta(hours=1)), "end": _hhmm(local + timedelta(hours=1))},
    )
    await client.put("/v1/categories/digest", json={"email_quiet_hours": True})
    nid = await send(client, category="digest")
    await wait_status(client, nid, "delayed")


async def test_locale_falls_back_from_region_to_language_to_default(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    await put_user(client, locale="pt-BR")
    portuguese = await send(client)
    await put_user(client, locale="de-AT")
    default = await send(client)
    await wait_status(client, portuguese, "sent")
    await wait_status(client, default, "sent")
    assert (await sandbox_for(client, portuguese))[0]["subject"] == "Seu pedido 123 foi enviado"
    assert (await sandbox_for(client, default))[0]["subject"] == "Your order 123 has shipped"


async def test_template_reaching_python_internals_is_refused_and_nothing_is_sent(
    stack: Stack, client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    attack = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    created = await client.post(
        "/v1/templates", json={"name": "evil", "channel": "sms", "body": attack, "sample_data": {}}
    )
    assert_error(created, 422, "unsafe_template")
    computed = "{{ cycler|attr('_'*2 ~ 'init' ~ '_'*2) }}"
    inline = email_send(template=None, content={"subject": "hi", "body": computed})
    assert_error(await client.post("/v1/notifications", json=inline), 422, "unsafe_template")
    assert await count_notifications(engine, tenant.id) == 0
    assert (await client.get("/v1/templates/evil")).status_code == 404
