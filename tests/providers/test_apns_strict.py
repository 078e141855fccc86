"""The APNs fake frames and refuses like APNs; ApnsProvider's alert pushes pass it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import h2.connection
import h2.events
import jwt
import pytest

from harness.fakes import make_message
from harness.fakes.apns import FakeApns
from providers.apns import ApnsProvider
from schema.enums import Channel, Priority
from tests.fixtures.provider_settings import apns_settings

DEVICE = "ab" * 32


@pytest.fixture
async def fake() -> AsyncIterator[FakeApns]:
    async with FakeApns(tls=False) as server:
        yield server


def provider_jwt(fake: FakeApns) -> str:
    return jwt.encode(
        {"iss": fake.team_id, "iat": int(__import__("time").time())},
        fake.private_key_pem(),
        algorithm="ES256",
        headers={"kid": fake.key_id},
    )


async def exchange(
    fake: FakeApns, headers: dict[str, str], body: bytes, device: str = DEVICE
) -> list[tuple[type, int, bool]]:
    """One push over cleartext h2; returns (event type, data length, stream ended) per frame event."""
    reader, writer = await asyncio.open_connection("127.0.0.1", fake.port)
    conn = h2.connection.H2Connection()
    conn.initiate_connection()
    request = [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "x"),
        (":path", f"/3/device/{device}"),
    ]
    request += [("authorization", f"bearer {provider_jwt(fake)}"), *headers.items()]
    conn.send_headers(1, request)
    conn.send_data(1, body, end_stream=True)
    writer.write(conn.data_to_send())
    seen: list[tuple[type, int, bool]] = []
    try:
        async with asyncio.timeout(5):
            while not any(ended for *_, ended in seen):
                for event in conn.receive_data(await reader.read(65535)):
                    if isinstance(event, (h2.events.ResponseReceived, h2.events.DataReceived)):
                        ended = event.stream_ended is not None
                        seen.append((type(event), len(getattr(event, "data", b"")), ended))
                        if isinstance(event, h2.events.ResponseReceived):
                            status = dict(event.headers)[b":status"]
                            seen.append((int, int(status), ended))
                writer.write(conn.data_to_send())
    finally:
        writer.close()
    return seen


ALERT = json.dumps({"aps": {"alert": "hi"}}).encode()


def topic_headers(fake: FakeApns, **extra: str) -> dict[str, str]:
    return {"apns-topic": fake.topic, **extra}


async def test_a_200_is_one_headers_frame_with_end_stream(fake: FakeApns) -> None:
    frames = await exchange(fake, topic_headers(fake), ALERT)

    assert frames == [(h2.events.ResponseReceived, 0, True), (int, 200, True)]


async def test_an_error_is_headers_then_one_data_frame_with_end_stream(fake: FakeApns) -> None:
    frames = await exchange(fake, topic_headers(fake), ALERT, device="ab" * 31)

    assert frames[:2] == [(h2.events.ResponseReceived, 0, False), (int, 400, False)]
    assert len(frames) == 3 and frames[2][0] is h2.events.DataReceived and frames[2][1] > 0 and frames[2][2]


@pytest.mark.parametrize(
    ("headers", "body", "device", "status"),
    [
        (
            {"apns-push-type": "background", "apns-priority": "10"},
            b'{"aps":{"content-available":1}}',
            DEVICE,
            400,
        ),
        ({"apns-push-type": "background", "apns-priority": "5"}, b'{"aps":{"alert":"x"}}', DEVICE, 400),
        (
            {"apns-push-type": "background", "apns-priority": "5"},
            b'{"aps":{"content-available":1}}',
            DEVICE,
            200,
        ),
        ({"apns-push-type": "alert"}, ALERT, "ab" * 33, 400),
        ({"apns-push-type": "alert"}, ALERT, "zz" * 32, 400),
    ],
)
async def test_background_priority_alert_and_token_shape(
    fake: FakeApns, headers: dict[str, str], body: bytes, device: str, status: int
) -> None:
    frames = await exchange(fake, topic_headers(fake, **headers), body, device=device)

    assert frames[1] == (int, status, status == 200)


async def test_voip_uses_voip_topic_and_may_carry_5_kb(fake: FakeApns) -> None:
    payload = json.dumps({"aps": {}, "pad": "x" * 5000}).encode()
    assert 4096 < len(payload) <= 5120
    voip = {"apns-push-type": "voip", "apns-topic": f"{fake.topic}.voip"}

    assert (await exchange(fake, voip, payload))[1] == (int, 200, True)
    assert (await exchange(fake, {**voip, "apns-topic": fake.topic}, payload))[1][1] == 400
    assert (await exchange(fake, topic_headers(fake), payload))[1][1] == 413


async def test_stop_removes_its_temporary_directory() -> None:
    fake = FakeApns(tls=True)
    async with fake:
        assert fake.ca_file.exists()

    assert not fake.ca_file.parent.exists()


@pytest.mark.parametrize("priority", [Priority.normal, Priority.critical])
async def test_adapter_alert_with_data_passes_strict_fake(priority: Priority) -> None:
    async with FakeApns() as fake:
        adapter = ApnsProvider(apns_settings(fake, connections=1))
        try:
            for _ in range(3):
                await adapter.send(make_message(Channel.push, to=DEVICE, priority=priority, data={"k": "v"}))
        finally:
            await adapter.aclose()

    assert len({r.peer for r in fake.requests}) == 1  # one connection reused
    assert all(r.headers["apns-push-type"] == "alert" for r in fake.requests)
    assert fake.requests[0].body["k"] == "v" or fake.requests[0].body.get("data", {}).get("k") == "v"
