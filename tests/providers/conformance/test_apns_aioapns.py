"""The APNs fake driven by aioapns (a maintained APNs client): it must agree with every answer."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import AsyncIterator

import pytest
from aioapns import APNs, NotificationRequest, PushType
from aioapns.connection import APNsProductionClientProtocol

from harness.fakes.apns import FakeApns
from tests.fixtures.provider_fakes import running_fake

DEVICE = "cd" * 32


fake = running_fake(FakeApns)


@pytest.fixture
async def client(fake: FakeApns) -> AsyncIterator[APNs]:
    # aioapns has no base-URL option: point its protocol class at the fake.
    protocol = type(
        "FakeHost", (APNsProductionClientProtocol,), {"APNS_SERVER": "127.0.0.1", "APNS_PORT": fake.port}
    )
    apns = APNs(
        key=fake.private_key_pem(),
        key_id=fake.key_id,
        team_id=fake.team_id,
        topic=fake.topic,
        ssl_context=ssl.create_default_context(cafile=str(fake.ca_file)),
        max_connection_attempts=1,
    )
    apns.pool.protocol_class = protocol
    yield apns
    apns.pool.close()


def alert(device: str = DEVICE, **kwargs: object) -> NotificationRequest:
    return NotificationRequest(device_token=device, message={"aps": {"alert": "hi"}}, **kwargs)  # type: ignore[arg-type]


async def test_many_pushes_share_one_connection_and_one_token(fake: FakeApns, client: APNs) -> None:
    results = [await client.send_notification(alert()) for _ in range(20)]

    assert all(r.is_successful for r in results)
    assert len({r.peer for r in fake.requests}) == 1, "aioapns reconnected: the fake's framing is wrong"
    assert len(fake.jwts) == 1


async def test_apns_id_is_echoed(client: APNs) -> None:
    request = alert(notification_id=str(uuid.uuid4()))

    result = await client.send_notification(request)

    assert result.is_successful and result.notification_id == request.notification_id


@pytest.mark.parametrize(
    ("reason", "status"), [("BadDeviceToken", "400"), ("Unregistered", "410"), ("TooManyRequests", "429")]
)
async def test_error_reasons_reach_the_client(fake: FakeApns, client: APNs, reason: str, status: str) -> None:
    fake.fail_token(DEVICE, reason)

    result = await client.send_notification(alert())

    assert (result.is_successful, result.status, result.description) == (False, status, reason)
    if status == "410":
        assert result.timestamp is not None


async def test_background_push_with_priority_5_and_voip_are_accepted(fake: FakeApns, client: APNs) -> None:
    background = NotificationRequest(
        device_token=DEVICE,
        message={"aps": {"content-available": 1}},
        priority=5,
        push_type=PushType.BACKGROUND,
    )

    assert (await client.send_notification(background)).is_successful
    refused = NotificationRequest(
        device_token=DEVICE,
        message={"aps": {"content-available": 1}},
        priority=10,
        push_type=PushType.BACKGROUND,
    )
    assert (await client.send_notification(refused)).description == "BadPriority"


async def test_expired_provider_token_is_reported(fake: FakeApns, client: APNs) -> None:
    assert (await client.send_notification(alert())).is_successful
    fake.expire_provider_tokens()

    result = await client.send_notification(alert())

    assert (result.status, result.description) == ("403", "ExpiredProviderToken")
