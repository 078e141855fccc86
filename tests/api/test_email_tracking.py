"""Clarion's own email tracking through the API's real routes, and once end to end: a tracked
email through the worker to the sandbox, its pixel and link opened, the notification showing both."""

from __future__ import annotations

import re
from urllib.parse import urlsplit
from uuid import UUID

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.settings import Settings
from clarion.tracking_tokens import make_tracking_token
from core.engagement import MAX_COUNTED
from harness.services import ApiServer
from tests.conftest import Stack, TenantInfo
from tests.fixtures.answers import assert_error
from tests.fixtures.delivery import sandbox_for, wait_status
from tests.fixtures.engagement import flood_behind_a_locked_row
from tests.fixtures.hooks import sent_notification, view
from tests.fixtures.sends import email_send

BROWSER = "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:133.0) Gecko/20100101 Firefox/133.0"
APPLE_PROXY = "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko)"


def token(settings: Settings, tenant: TenantInfo, nid: str, link: str | None) -> str:
    secret = settings.secret_key.get_secret_value()
    return make_tracking_token(secret=secret, tenant_id=tenant.id, notification_id=UUID(nid), link=link)


def engagement(body: dict[str, object]) -> dict[tuple[str, str | None], int]:
    return {(e["type"], e["link"]): e["count"] for e in body["engagement"]}  # type: ignore[attr-defined, index]


async def test_the_pixel_counts_opens_and_a_privacy_proxy_is_flagged_not_counted(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, settings: Settings
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="email")
    url = f"/t/o/{token(settings, tenant, nid, None)}"
    for agent in (BROWSER, BROWSER, APPLE_PROXY):
        pixel = await client.get(url, headers={"User-Agent": agent, "Authorization": ""})
        assert pixel.status_code == 200 and pixel.headers["content-type"] == "image/gif"
        assert pixel.content.startswith(b"GIF89a") and "no-store" in pixel.headers["cache-control"]
    body = await view(client, nid)
    assert engagement(body) == {("opened", None): 2, ("prefetched", None): 1}
    assert body["status"] == "sent"


async def test_pixel_hits_past_max_counted_are_answered_but_not_counted(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, settings: Settings
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="email")
    url = f"/t/o/{token(settings, tenant, nid, None)}"
    for _ in range(MAX_COUNTED + 5):  # anyone holding the email can load its pixel
        pixel = await client.get(url, headers={"User-Agent": BROWSER, "Authorization": ""})
        assert pixel.status_code == 200 and pixel.content.startswith(b"GIF89a")
    assert engagement(await view(client, nid)) == {("opened", None): MAX_COUNTED}


async def test_a_flood_of_one_pixel_holds_no_more_than_its_share_of_the_pool(
    api: ApiServer, client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, settings: Settings
) -> None:
    """Anyone holding a tracked mail can load its pixel in a loop, and every hit of one token
    updates one engagement row: the hits queued on its lock, each holding a pooled connection the
    accept path shares, and another tenant's sends waited for one (api/engagement_gate.py). The row is
    held locked here so the hits wait inside PostgreSQL, as a flood's do on each other."""
    nid, _ = await sent_notification(engine, tenant, channel="email")
    url = f"/t/o/{token(settings, tenant, nid, None)}"
    assert (await client.get(url, headers={"User-Agent": BROWSER})).status_code == 200

    answers = await flood_behind_a_locked_row(
        settings=settings,
        engine=engine,
        api_url=api.url,
        nid=nid,
        hit=lambda: client.get(url, headers={"User-Agent": BROWSER, "Authorization": ""}),
    )

    assert all(a.status_code == 200 and a.content.startswith(b"GIF89a") for a in answers)


async def test_a_link_redirects_where_its_signed_token_says_and_nowhere_else(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, settings: Settings
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="email")
    link = "https://shop.example/orders/1?a=1&b=2"
    good = token(settings, tenant, nid, link)
    answer = await client.get(f"/t/c/{good}", headers={"User-Agent": BROWSER})
    assert answer.status_code == 302 and answer.headers["location"] == link
    scanner = await client.get(f"/t/c/{good}", headers={"User-Agent": "Mimecast LinkScanner/1.0"})
    assert scanner.status_code == 302
    assert engagement(await view(client, nid)) == {("clicked", link): 1, ("prefetched", link): 1}

    payload, signature = good.split(".")
    evil = token(settings, tenant, nid, "https://evil.example/").split(".")[0]
    forged = [
        f"{evil}.{signature}",  # another URL under this link's signature
        make_tracking_token(secret="not-ours", tenant_id=tenant.id, notification_id=UUID(nid), link=link),
        f"{payload}.{signature}x",
    ]
    for bad in forged:
        assert_error(await client.get(f"/t/c/{bad}"), 403, "invalid_token")
        assert_error(await client.get(f"/t/o/{bad}"), 403, "invalid_token")
    pixel_token = token(settings, tenant, nid, None)
    assert_error(await client.get(f"/t/c/{pixel_token}"), 404, "not_found")
    assert_error(await client.get(f"/t/o/{good}"), 404, "not_found")
    assert engagement(await view(client, nid)) == {("clicked", link): 1, ("prefetched", link): 1}


@pytest.mark.parametrize(
    "path", ["/t/c/" + "A" * 9_000 + ".B", "/t/o/not-a-token", "/t/c/%00.%00", "/t/o/a.b.c"]
)
async def test_hostile_tokens_are_refused_with_the_error_body(client: httpx.AsyncClient, path: str) -> None:
    answer = await client.get(path)
    assert answer.status_code in (403, 422), answer.text
    assert "code" in answer.json()["error"]


async def test_a_tracked_email_end_to_end_shows_its_open_and_click(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    assert (
        await client.put(
            "/v1/tenant/settings", json={"content_dedupe_window_s": None, "email_tracking": True}
        )
    ).json()["email_tracking"]
    content = {
        "subject": "Your order",
        "body": "Track it at https://shop.example/track",
        "html": '<html><body><a href="https://shop.example/track?o={{ order }}&amp;x=1">Track</a>'
        '<a href="mailto:help@shop.example">help</a></body></html>',
    }
    nid = (
        await client.post(
            "/v1/notifications", json=email_send(template=None, content=content, data={"order": "7"})
        )
    ).json()["id"]
    await wait_status(client, nid, "sent")
    [message] = await sandbox_for(client, nid)
    sent_html = message["html"]
    clicks = re.findall(r'href="([^"]*/t/c/[^"]+)"', sent_html)
    pixels = re.findall(r'src="([^"]*/t/o/[^"]+)"', sent_html)
    assert len(clicks) == 1 and len(pixels) == 1 and 'href="mailto:help@shop.example"' in sent_html
    assert message["body"] == "Track it at https://shop.example/track"  # the text part is left alone

    # Through the API's real routes, as a mail client would follow them.
    opened = await client.get(urlsplit(pixels[0]).path, headers={"User-Agent": BROWSER})
    assert opened.status_code == 200
    followed = await client.get(urlsplit(clicks[0]).path, headers={"User-Agent": BROWSER})
    assert (
        followed.status_code == 302 and followed.headers["location"] == "https://shop.example/track?o=7&x=1"
    )
    body = await view(client, nid)
    assert engagement(body) == {("opened", None): 1, ("clicked", "https://shop.example/track?o=7&x=1"): 1}
    assert body["status"] == "sent"


async def test_a_template_version_overrides_the_tenant_and_only_email_templates_have_the_switch(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    await client.put("/v1/tenant/settings", json={"content_dedupe_window_s": None, "email_tracking": True})
    template = {
        "name": "receipt",
        "channel": "email",
        "subject": "Receipt",
        "body": "b",
        "html": '<a href="https://shop.example/r">r</a>',
        "track_email": False,
    }
    created = await client.post("/v1/templates", json=template)
    assert created.status_code == 201 and created.json()["track_email"] is False, created.text
    nid = (await client.post("/v1/notifications", json=email_send(template="receipt", data={}))).json()["id"]
    await wait_status(client, nid, "sent")
    [message] = await sandbox_for(client, nid)
    assert message["html"] == '<a href="https://shop.example/r">r</a>'
    sms = {"name": "code", "channel": "sms", "body": "b", "track_email": True}
    assert_error(await client.post("/v1/templates", json=sms), 422, "validation_error")
