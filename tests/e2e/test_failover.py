"""Circuit breaker and SMTP failover end to end: SendGrid (its local fake) goes down, its breaker
opens, email is delivered through a real local SMTP server (aiosmtpd) meanwhile; SendGrid comes
back, a probe closes the breaker and email goes through SendGrid again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from email import message_from_bytes

import httpx
import pytest
from aiosmtpd.controller import Controller

from clarion.ports import free_port
from clarion.retry_settings import BreakerSettings
from clarion.settings import Settings
from harness.fakes.sendgrid import FakeSendGrid
from harness.services import wait_until
from providers.registry import ProviderSet
from providers.sendgrid import SendGridProvider
from providers.settings import SmtpSettings
from providers.smtp import SmtpProvider
from schema.enums import Channel
from tests.fixtures.delivery import wait_status
from tests.fixtures.mailbox import Mailbox
from tests.fixtures.own_lane import OwnLane, fast_retries, own_lane, tenant_client
from tests.fixtures.provider_settings import sendgrid_settings
from tests.fixtures.sends import email_send

COOL_DOWN_S = 4.0  # the held send must meet open breakers: 1.5 s ran out under a loaded CI run


class Fakes:
    """SendGrid's fake, and the real local SMTP server email fails over to, both on while in use."""

    def __init__(self) -> None:
        self.sendgrid = FakeSendGrid()
        self.mailbox = Mailbox()
        self.smtp_port = free_port()
        self.controller = Controller(self.mailbox, hostname="127.0.0.1", port=self.smtp_port)

    async def __aenter__(self) -> Fakes:
        await self.sendgrid.start()
        self.controller.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.controller.stop()
        await self.sendgrid.stop()

    def smtp_down(self) -> None:
        self.controller.stop()

    def smtp_up(self) -> None:
        self.controller = Controller(self.mailbox, hostname="127.0.0.1", port=self.smtp_port)
        self.controller.start()


EmailLane = OwnLane[Fakes]


@pytest.fixture(scope="module")
async def email_lane(settings: Settings) -> AsyncIterator[EmailLane]:
    retry = fast_retries(
        breaker=BreakerSettings(failure_rate=0.5, window_s=30, min_calls=3, cool_down_s=COOL_DOWN_S)
    )
    async with own_lane(
        settings, database="clarion_failover", fake=Fakes(), providers=with_failover, retry=retry
    ) as lane:
        yield lane


def with_failover(fakes: Fakes) -> ProviderSet:
    """SendGrid first; SMTP when SendGrid's breaker is open."""
    smtp = SmtpSettings(
        host="127.0.0.1", port=fakes.smtp_port, from_email="noreply@clarion.test", starttls=False
    )
    return ProviderSet(
        routes={(Channel.email, None): SendGridProvider(sendgrid_settings(fakes.sendgrid, timeout_s=2))},
        failover={Channel.email: SmtpProvider(smtp)},
    )


@pytest.fixture
async def email_client(email_lane: EmailLane) -> AsyncIterator[httpx.AsyncClient]:
    email_lane.fake.sendgrid.reset()
    async with tenant_client(email_lane) as client:
        yield client


async def send_email(client: httpx.AsyncClient, address: str) -> str:
    response = await client.post("/v1/notifications", json=email_send(user={"id": address, "email": address}))
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def test_sendgrid_down_opens_its_breaker_and_email_is_delivered_via_smtp_until_it_recovers(
    email_lane: EmailLane, email_client: httpx.AsyncClient
) -> None:
    sendgrid, mailbox = email_lane.fake.sendgrid, email_lane.fake.mailbox
    sendgrid.force_server_error(1000, status=503)

    # A 503 is retried in-process (2 attempts here), then SMTP delivers. The breaker judges after
    # 3 calls: the 2nd email's first SendGrid failure opens it, so its retry fails over at once.
    expected = {
        "down0@example.com": [("sendgrid", "transient"), ("sendgrid", "transient"), ("smtp", "sent")],
        "down1@example.com": [("sendgrid", "transient"), ("smtp", "sent")],
    }
    for address, attempts in expected.items():
        nid = await send_email(email_client, address)
        body = await wait_status(email_client, nid, "sent")
        assert body["provider"] == "smtp"
        assert [(a["provider"], a["outcome"]) for a in body["delivery_attempts"]] == attempts
    assert email_lane.worker.breakers.snapshot()["sendgrid"] == "open"
    calls_when_opened = len(sendgrid.requests)

    # While open, SendGrid is not called at all: the call count stops growing.
    nid = await send_email(email_client, "open@example.com")
    body = await wait_status(email_client, nid, "sent")
    assert [(a["provider"], a["outcome"]) for a in body["delivery_attempts"]] == [("smtp", "sent")]
    assert len(sendgrid.requests) == calls_when_opened
    [delivered] = mailbox.to("open@example.com")
    mime = message_from_bytes(delivered.content)
    assert mime["Subject"] and "123" in mime["Subject"]
    assert mime["From"] == "noreply@clarion.test"

    # SendGrid recovers; after the cool-down one probe goes to it, succeeds and closes the breaker.
    sendgrid.reset()
    await wait_until(
        lambda: email_lane.worker.breakers.snapshot()["sendgrid"] == "half_open", COOL_DOWN_S + 2
    )
    nid = await send_email(email_client, "back@example.com")
    body = await wait_status(email_client, nid, "sent")
    assert body["provider"] == "sendgrid"
    assert [(a["provider"], a["outcome"]) for a in body["delivery_attempts"]] == [("sendgrid", "sent")]
    assert email_lane.worker.breakers.snapshot()["sendgrid"] == "closed"
    assert mailbox.to("back@example.com") == []


async def test_with_every_email_route_down_notifications_wait_for_the_breakers_without_using_attempts(
    email_lane: EmailLane, email_client: httpx.AsyncClient
) -> None:
    sendgrid, mailbox = email_lane.fake.sendgrid, email_lane.fake.mailbox
    await wait_until(
        lambda: email_lane.worker.breakers.snapshot().get("sendgrid") == "closed", COOL_DOWN_S + 2
    )
    sendgrid.force_server_error(1000, status=503)
    email_lane.fake.smtp_down()
    try:
        failing = [await send_email(email_client, f"both{i}@example.com") for i in range(3)]
        for nid in failing:
            await wait_status(email_client, nid, "retrying")
        await wait_until(
            lambda: email_lane.worker.breakers.snapshot().items() >= {("sendgrid", "open"), ("smtp", "open")},
            5,
        )
        calls = len(sendgrid.requests)

        held_id = await send_email(email_client, "held@example.com")
        held = await wait_status(email_client, held_id, "retrying")
        assert held["error"]["code"] == "circuit_open"
        assert held["attempts"] == 0 and held["delivery_attempts"] == [], "a refused call is not an attempt"
        assert len(sendgrid.requests) == calls
    finally:
        sendgrid.reset()
        email_lane.fake.smtp_up()

    for nid in [*failing, held_id]:
        await wait_status(email_client, nid, "sent", 30)
    assert (
        len(mailbox.to("held@example.com"))
        + len([r for r in sendgrid.requests if "held@example.com" in r.raw.decode()])
        == 1
    )
