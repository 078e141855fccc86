"""Issue #17's proof, over the real broker: an email with tracking on is sent, its pixel and a link
are opened through the API's real routes, the notification shows `opened` and `clicked`, analytics
shows the rates, and the tenant's webhook receiver got `notification.sent`, `.opened` and
`.clicked`, each verified with the `standardwebhooks` package, none lost, none twice."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from clarion.settings import Settings
from harness.services import ApiServer, wait_until
from tests.conftest import Stack
from tests.fixtures.delivery import sandbox_for, wait_status
from tests.fixtures.sends import email_send
from tests.fixtures.webhook_receiver import Receiver
from tests.fixtures.webhooks import allow_local, fast, register, sender

BROWSER = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0"
TYPES = ["notification.sent", "notification.opened", "notification.clicked"]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = await Receiver().start()
    yield r
    await r.stop()


async def test_a_tracked_email_is_opened_and_clicked_and_every_event_reaches_the_tenant(
    stack: Stack, client: httpx.AsyncClient, settings: Settings, receiver: Receiver
) -> None:
    local = ApiServer(allow_local(settings))  # the same app, with 127.0.0.1 allowed for the receiver
    await local.start()
    try:
        async with httpx.AsyncClient(base_url=local.url, headers=dict(client.headers), timeout=15) as admin:
            endpoint = await register(admin, receiver.url, TYPES)
            receiver.secrets.append(endpoint["secret"])
        tenant_settings = {"content_dedupe_window_s": None, "email_tracking": True}
        assert (await client.put("/v1/tenant/settings", json=tenant_settings)).status_code == 200
        content = {
            "subject": "Shipped",
            "body": "b",
            "html": '<p><a href="https://shop.example/o/1">Track</a></p>',
        }
        nid = (
            await client.post("/v1/notifications", json=email_send(template=None, content=content))
        ).json()["id"]
        await wait_status(client, nid, "sent")
        [message] = await sandbox_for(client, nid)
        [click] = re.findall(r'href="([^"]*/t/c/[^"]+)"', message["html"])
        [pixel] = re.findall(r'src="([^"]*/t/o/[^"]+)"', message["html"])

        assert (await client.get(urlsplit(pixel).path, headers={"User-Agent": BROWSER})).status_code == 200
        followed = await client.get(urlsplit(click).path, headers={"User-Agent": BROWSER})
        assert followed.status_code == 302 and followed.headers["location"] == "https://shop.example/o/1"

        shown = (await client.get(f"/v1/notifications/{nid}")).json()
        assert {(e["type"], e["link"]) for e in shown["engagement"]} == {
            ("opened", None), ("clicked", "https://shop.example/o/1"),
        }  # fmt: skip

        async def rates() -> dict[str, Any] | None:
            page = (
                await client.get("/v1/analytics", params={"interval": "hour", "group_by": "channel"})
            ).json()
            rows = [r for r in page["rows"] if r["group"]["channel"] == "email"]
            return rows[0] if rows and rows[0]["counts"]["clicked"] == 1 else None

        row = await wait_until(rates)
        assert (
            row["counts"]["sent"] == 1
            and row["rates"]["open_rate"] == 1.0
            and row["rates"]["click_rate"] == 1.0
        )

        async with sender(settings, fast(settings)):
            await wait_until(lambda: all(receiver.of_type(t) for t in TYPES), 30)
        for t in TYPES:
            [event] = receiver.of_type(t)
            assert event.data["notification_id"] == nid
        assert receiver.unverified == 0 and receiver.duplicates() == 0
    finally:
        await local.stop()
