"""Delivery reports end to end: API -> Kafka -> worker -> Twilio/SendGrid fake -> the fake POSTs
signed status callbacks / Event Webhook batches to the running API -> the notification shows them.

The workers use the real Twilio and SendGrid adapters pointed at the fakes (as in
``test_real_providers``), with ``status_callbacks`` on, so the ``StatusCallback`` URL they send is
built from ``public_url``, here the test API's own URL. A database and broker of their own keep
their consumer groups apart from the sandbox stack.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from clarion.broker import TansuBroker
from clarion.kafka import create_topics
from clarion.settings import Settings
from harness.fakes.sendgrid import FakeSendGrid
from harness.fakes.twilio import FakeTwilio
from harness.services import ApiServer, api_client, drop_database, fresh_database, wait_until
from schema.db import create_engine
from schema.enums import Channel
from tests.conftest import make_tenant
from tests.fixtures.delivery import status_of, wait_status
from tests.fixtures.sends import email_send
from workers.app import Worker


@dataclass
class HookedStack:
    client: httpx.AsyncClient
    twilio: FakeTwilio
    sendgrid: FakeSendGrid


@pytest.fixture(scope="module")
async def hooked(settings: Settings) -> AsyncIterator[HookedStack]:
    twilio, sendgrid = FakeTwilio(), FakeSendGrid()
    await twilio.start()
    await sendgrid.start()
    broker = TansuBroker()
    broker.start()
    url = await fresh_database("clarion_hooks")
    await create_topics(broker.bootstrap, partitions=1)
    api = ApiServer(settings)  # picks the port the public URL names
    own = Settings(
        **{
            **settings.model_dump(),
            "database_url": url,
            "kafka_bootstrap": broker.bootstrap,
            "api_port": api.settings.api_port,
            "public_url": api.url,
            "providers": {
                "twilio": {"account_sid": twilio.account_sid, "auth_token": twilio.auth_token,
                           "from_number": "+14155550199", "base_url": twilio.url, "status_callbacks": True},
                "sendgrid": {"api_key": sendgrid.api_key, "from_email": "noreply@clarion.test",
                             "base_url": sendgrid.url, "webhook_public_key": sendgrid.public_key},
            },
        }
    )  # fmt: skip
    assert own.providers.twilio.status_callback_url == f"{api.url}/v1/webhooks/twilio/status"
    api.settings = own
    sendgrid.webhook_url = f"{api.url}/v1/webhooks/sendgrid/events"
    twilio.callback_delay_s = sendgrid.webhook_delay_s = 0.5  # reports trail the send, as for real
    workers = [Worker(own, channel) for channel in (Channel.sms, Channel.email)]
    await asyncio.gather(*(w.start() for w in workers))
    await api.start()
    engine = create_engine(url, pool_size=1)
    tenant = await make_tenant(engine)
    await engine.dispose()
    async with api_client(api.url, tenant.key) as client:
        yield HookedStack(client, twilio, sendgrid)
    await api.stop()
    await asyncio.gather(*(w.stop() for w in workers))
    broker.stop()
    await twilio.stop()
    await sendgrid.stop()
    await drop_database(url)


async def wait_report(client: httpx.AsyncClient, nid: str, provider: str, status: str) -> dict[str, Any]:
    """The notification once its history has ``provider``'s report of ``status``."""

    async def reported() -> dict[str, Any] | None:
        body = await status_of(client, nid)
        reports = [h for h in body["history"] if (h["detail"] or "").startswith(provider)]
        return body if any(h["status"] == status for h in reports) else None

    return dict(await wait_until(reported, timeout_s=15))


def sms(phone: str, user_id: str) -> dict[str, Any]:
    return email_send(
        channel="sms", template="otp", data={"code": "777111"}, user={"id": user_id, "phone": phone}
    )


async def test_sms_delivery_report_shows_on_the_notification(hooked: HookedStack) -> None:
    phone = "+1415555" + str(secrets.randbelow(9000) + 1000)
    nid = (
        await hooked.client.post("/v1/notifications", json=sms(phone, f"u-{secrets.token_hex(3)}"))
    ).json()["id"]

    body = await wait_report(hooked.client, nid, "twilio", "delivered")

    assert body["status"] == "sent"
    [delivered] = [h for h in body["history"] if h["status"] == "delivered"]
    assert body["provider_message_id"] in delivered["detail"]
    posted = [c for c in hooked.twilio.callbacks if c.params["To"] == phone]
    assert [(c.params["MessageStatus"], c.status) for c in posted] == [("sent", 200), ("delivered", 200)]


async def test_email_delivery_event_shows_on_the_notification(hooked: HookedStack) -> None:
    address = f"ada-{secrets.token_hex(3)}@example.com"
    body = email_send(user={"id": f"u-{secrets.token_hex(3)}", "email": address})
    nid = (await hooked.client.post("/v1/notifications", json=body)).json()["id"]

    shown = await wait_report(hooked.client, nid, "sendgrid", "delivered")

    assert shown["status"] == "sent"
    assert [h["status"] for h in shown["history"]].count("delivered") == 1


async def test_sms_stop_reply_opts_the_user_out_so_the_next_sms_is_suppressed(hooked: HookedStack) -> None:
    phone = "+1415555" + str(secrets.randbelow(9000) + 1000)
    user_id = f"u-{secrets.token_hex(3)}"
    hooked.twilio.fail_number_async(phone, 21610)
    first = (await hooked.client.post("/v1/notifications", json=sms(phone, user_id))).json()["id"]

    reported = await wait_report(hooked.client, first, "twilio", "undelivered")
    again = (await hooked.client.post("/v1/notifications", json=sms(phone, user_id))).json()["id"]
    suppressed = await wait_status(hooked.client, again, "suppressed")

    assert reported["error"]["code"] == "21610"
    assert suppressed["delivery_attempts"] == []
    assert len([r for r in hooked.twilio.requests if r.body.get("To") == phone]) == 1


async def test_hard_bounce_opts_the_user_out_so_the_next_email_is_suppressed(hooked: HookedStack) -> None:
    address = f"gone-{secrets.token_hex(3)}@example.com"
    user = {"id": f"u-{secrets.token_hex(3)}", "email": address}
    hooked.sendgrid.bounce_email(address)
    first = (await hooked.client.post("/v1/notifications", json=email_send(user=user))).json()["id"]

    await wait_report(hooked.client, first, "sendgrid", "bounce")
    again = (await hooked.client.post("/v1/notifications", json=email_send(user=user))).json()["id"]

    assert (await wait_status(hooked.client, again, "suppressed"))["delivery_attempts"] == []


async def test_email_opens_and_clicks_reported_by_sendgrid_are_engagement_counted_once_per_event(
    hooked: HookedStack,
) -> None:
    address = f"reader-{secrets.token_hex(3)}@example.com"
    body = email_send(user={"id": f"u-{secrets.token_hex(3)}", "email": address})
    nid = (await hooked.client.post("/v1/notifications", json=body)).json()["id"]
    await wait_report(hooked.client, nid, "sendgrid", "delivered")
    [delivered] = [
        e for post in hooked.sendgrid.event_posts for e in post.events
        if e.get("notification_id") == nid and e["event"] == "delivered"
    ]  # fmt: skip
    common = {k: v for k, v in delivered.items() if k not in ("event", "response", "sg_event_id")}
    url = "https://shop.example.com/orders/123"
    reading = [
        {**common, "event": "open", "sg_event_id": secrets.token_urlsafe(16)},
        {**common, "event": "click", "url": url, "sg_event_id": secrets.token_urlsafe(16)},
    ]

    first = await hooked.sendgrid.post_events(reading)
    replayed = await hooked.sendgrid.post_events(reading)  # SendGrid retries a batch it thinks failed

    assert (first.status, replayed.status) == (200, 200)
    shown = await status_of(hooked.client, nid)
    engagement = {(e["type"], e["link"]): (e["count"], e["source"]) for e in shown["engagement"]}
    assert engagement == {
        ("delivered", None): (1, "sendgrid"),
        ("opened", None): (1, "sendgrid"),
        ("clicked", url): (1, "sendgrid"),
    }
    assert shown["status"] == "sent"
