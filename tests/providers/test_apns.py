"""ApnsProvider against the local HTTP/2 APNs fake (TLS with a self-signed certificate)."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import jwt
import pytest

from harness.fakes import make_message
from harness.fakes.apns import FakeApns
from providers.apns import ApnsProvider
from providers.base import RenderedMessage
from providers.errors import (
    InvalidRecipient,
    PermanentProviderError,
    RecipientThrottled,
    TransientProviderError,
)
from providers.settings import ApnsSettings
from schema.enums import Channel, Priority
from tests.fixtures.provider_fakes import adapter_for, running_fake, send_raises
from tests.fixtures.provider_settings import apns_settings

DEVICE = "ab" * 32


class Clock:
    """A settable wall clock: ``offset_s`` shifts real time (the fake checks ``iat`` against real time)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


fake = running_fake(FakeApns)


settings_for = partial(apns_settings, timeout_s=0.5)  # short: the timeout tests wait it out


provider = adapter_for(lambda fake: ApnsProvider(settings_for(fake)))


def push(**overrides: Any) -> RenderedMessage:
    return make_message(Channel.push, **{"to": DEVICE, **overrides})


async def test_send_posts_http2_alert_with_signed_token_and_returns_apns_id(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    expires_at = datetime.now(UTC) + timedelta(hours=1)
    message = push(
        priority=Priority.critical, data={"kind": "build"}, collapse_id="builds", expires_at=expires_at
    )

    result = await provider.send(message)

    [request] = fake.requests
    assert request.path == f"/3/device/{DEVICE}"
    assert request.headers["apns-topic"] == fake.topic
    assert request.headers["apns-push-type"] == "alert"
    assert request.headers["apns-priority"] == "10"
    assert request.headers["apns-id"] == str(message.notification_id)
    assert request.headers["apns-collapse-id"] == "builds"
    assert request.headers["apns-expiration"] == str(int(expires_at.timestamp()))
    assert request.body == {
        "aps": {"alert": {"title": "Build finished", "body": "main is green"}, "sound": "default"},
        "kind": "build",
    }
    token = request.headers["authorization"].removeprefix("bearer ")
    assert jwt.get_unverified_header(token) == {"alg": "ES256", "kid": fake.key_id, "typ": "JWT"}
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["iss"] == fake.team_id and isinstance(claims["iat"], int)
    assert result.provider_message_id == str(message.notification_id)
    assert (result.provider, result.http_status) == ("apns", 200)


async def test_normal_priority_without_extras_uses_priority_5(fake: FakeApns, provider: ApnsProvider) -> None:
    await provider.send(push(priority=Priority.normal, subject=None))

    request = fake.requests[0]
    assert request.headers["apns-priority"] == "5"
    assert "apns-collapse-id" not in request.headers and "apns-expiration" not in request.headers
    assert request.body == {"aps": {"alert": {"body": "main is green"}, "sound": "default"}}


async def test_cleartext_base_url_speaks_http2_with_prior_knowledge() -> None:
    async with FakeApns(tls=False) as fake:
        provider = ApnsProvider(settings_for(fake))
        try:
            result = await provider.send(push())
        finally:
            await provider.aclose()

    assert result.http_status == 200 and fake.url.startswith("http://")


async def test_provider_token_is_cached_across_sends(fake: FakeApns, provider: ApnsProvider) -> None:
    await asyncio.gather(*(provider.send(push()) for _ in range(20)))

    assert len(fake.jwts) == 1


async def test_provider_token_is_reminted_after_refresh_age() -> None:
    clock = Clock()
    async with FakeApns() as fake:
        provider = ApnsProvider(settings_for(fake), clock=clock)
        try:
            clock.offset_s = -46 * 60
            await provider.send(push())
            clock.offset_s = 0
            await provider.send(push())
        finally:
            await provider.aclose()

    assert len(fake.jwts) == 2


async def test_expired_provider_token_is_reminted_and_the_push_resent_once() -> None:
    clock = Clock()
    async with FakeApns() as fake:
        fake.enforce_token_update_rate = True
        provider = ApnsProvider(settings_for(fake), clock=clock)
        try:
            clock.offset_s = -50 * 60
            await provider.send(push())
            fake.expire_provider_tokens()
            clock.offset_s = -25 * 60  # the cached token is now 25 min old: re-minting is allowed
            result = await provider.send(push())
        finally:
            await provider.aclose()

    assert result.http_status == 200
    assert len(fake.jwts) == 2
    assert len(fake.requests) == 3  # ok, ExpiredProviderToken, resend


async def test_expired_provider_token_younger_than_20_minutes_raises_transient(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    await provider.send(push())
    fake.expire_provider_tokens()

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(push())

    assert (caught.value.code, caught.value.http_status) == ("ExpiredProviderToken", 403)
    assert len(fake.jwts) == 1


@pytest.mark.parametrize(
    "reason", ["BadDeviceToken", "Unregistered", "ExpiredToken", "DeviceTokenNotForTopic"]
)
async def test_dead_device_token_raises_invalid_recipient(
    fake: FakeApns, provider: ApnsProvider, reason: str
) -> None:
    fake.fail_token(DEVICE, reason)

    with pytest.raises(InvalidRecipient) as caught:
        await provider.send(push())

    assert caught.value.code == reason


async def test_malformed_device_token_raises_invalid_recipient(provider: ApnsProvider) -> None:
    with pytest.raises(InvalidRecipient) as caught:
        await provider.send(push(to="not-a-hex-token"))

    assert (caught.value.code, caught.value.http_status) == ("BadDeviceToken", 400)


async def test_wrong_signing_key_raises_permanent(fake: FakeApns) -> None:
    other = FakeApns()  # a different, unstarted fake: only its key is used
    caught = await send_raises(
        PermanentProviderError, ApnsProvider(settings_for(fake, private_key=other.private_key_pem())), push()
    )

    assert type(caught.value) is PermanentProviderError
    assert caught.value.code == "InvalidProviderToken"


async def test_wrong_topic_raises_permanent(fake: FakeApns) -> None:
    caught = await send_raises(
        PermanentProviderError, ApnsProvider(settings_for(fake, topic="com.other.app")), push()
    )

    assert type(caught.value) is PermanentProviderError
    assert caught.value.code == "BadTopic"


async def test_oversized_payload_is_refused_before_sending(fake: FakeApns, provider: ApnsProvider) -> None:
    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(push(data={"blob": "x" * 4096}))

    assert caught.value.code == "PayloadTooLarge"
    assert fake.requests == []


async def test_too_many_requests_raises_transient_with_retry_after(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    fake.force_rate_limit(retry_after_s=5)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(push())

    assert (caught.value.code, caught.value.http_status, caught.value.retry_after_s) == (
        "TooManyRequests",
        429,
        5,
    )


@pytest.mark.parametrize(
    ("reason", "status"),
    [("ServiceUnavailable", 503), ("Shutdown", 503), ("IdleTimeout", 400), ("InternalServerError", 500)],
)
async def test_server_side_failure_raises_transient(
    fake: FakeApns, provider: ApnsProvider, reason: str, status: int
) -> None:
    fake.force_reason(reason)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(push())

    assert (caught.value.code, caught.value.http_status) == (reason, status)
    assert len(fake.requests) == 1


async def test_timeout_raises_transient(fake: FakeApns, provider: ApnsProvider) -> None:
    fake.force_timeout(delay_s=2)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(push())

    assert caught.value.code == "timeout"


async def test_unreachable_host_raises_transient() -> None:
    settings = ApnsSettings.model_validate(
        {
            "key_id": "K",
            "team_id": "T",
            "topic": "t",
            "base_url": "http://127.0.0.1:9",
            "timeout_s": 1,
            "private_key": FakeApns().private_key_pem(),
        }
    )
    caught = await send_raises(TransientProviderError, ApnsProvider(settings), push())

    assert caught.value.code == "connection_error"


@pytest.mark.parametrize("collapse_id", ["a\r\nx-evil: 1", "a\nb", "a\x00b"])
async def test_collapse_id_with_a_line_break_is_refused_before_sending(
    fake: FakeApns, provider: ApnsProvider, collapse_id: str
) -> None:
    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(push(collapse_id=collapse_id))

    assert caught.value.code == "header_injection"
    assert fake.requests == []


@pytest.mark.parametrize("to", [DEVICE + "/../../x", DEVICE + "?a=b", "ab cd", DEVICE[:-1] + "\u00e9"])
async def test_device_token_cannot_change_the_request_path(
    fake: FakeApns, provider: ApnsProvider, to: str
) -> None:
    with pytest.raises(InvalidRecipient) as caught:
        await provider.send(push(to=to))

    assert caught.value.code == "BadDeviceToken"
    [request] = fake.requests
    assert request.path.count("/") == 3 and "?" not in request.path


async def test_payload_is_compact_json(fake: FakeApns, provider: ApnsProvider) -> None:
    await provider.send(push())

    raw = fake.requests[0].raw
    assert raw == json.dumps(fake.requests[0].body, separators=(",", ":")).encode()


async def test_too_many_requests_for_one_device_throttles_that_recipient_not_apns(
    fake: FakeApns, provider: ApnsProvider
) -> None:
    """APNs answers TooManyRequests for "too many requests to the same device token": about that
    device, so the worker must not count it against APNs (tests/workers/test_recipient_throttled.py)."""
    fake.fail_token(DEVICE, "TooManyRequests")

    with pytest.raises(RecipientThrottled) as caught:
        await provider.send(push())

    assert (caught.value.code, caught.value.http_status) == ("TooManyRequests", 429)
    fake.force_reason("TooManyProviderTokenUpdates")  # about our provider token: all of APNs
    with pytest.raises(TransientProviderError) as shared:
        await provider.send(push(to="cd" * 32))
    assert not isinstance(shared.value, RecipientThrottled)
