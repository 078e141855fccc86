"""TwilioProvider against the local Messages API fake."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from providers.errors import InvalidRecipient, PermanentProviderError, TransientProviderError
from providers.settings import TwilioSettings
from providers.twilio import TwilioProvider
from schema.enums import Channel
from tests.fakes import make_message
from tests.fakes.twilio import FakeTwilio, num_segments


@pytest.fixture
async def fake() -> AsyncIterator[FakeTwilio]:
    async with FakeTwilio() as server:
        yield server


def settings_for(fake: FakeTwilio, **overrides: object) -> TwilioSettings:
    values: dict[str, object] = {
        "account_sid": fake.account_sid,
        "auth_token": fake.auth_token,
        "from_number": "+14155550199",
        "base_url": fake.url,
        "timeout_s": 0.5,
        **overrides,
    }
    return TwilioSettings.model_validate(values)


@pytest.fixture
async def provider(fake: FakeTwilio) -> AsyncIterator[TwilioProvider]:
    adapter = TwilioProvider(settings_for(fake, status_callback_url="https://clarion.test/hooks/twilio"))
    yield adapter
    await adapter.aclose()


async def test_send_posts_form_with_basic_auth_and_returns_sid(
    fake: FakeTwilio, provider: TwilioProvider
) -> None:
    result = await provider.send(make_message(Channel.sms))

    [request] = fake.requests
    assert request.method == "POST"
    assert request.path == f"/2010-04-01/Accounts/{fake.account_sid}/Messages.json"
    assert request.headers["content-type"] == "application/x-www-form-urlencoded"
    expected_auth = base64.b64encode(f"{fake.account_sid}:{fake.auth_token}".encode()).decode()
    assert request.headers["authorization"] == f"Basic {expected_auth}"
    assert request.body == {
        "To": "+14155550100",
        "Body": "main is green",
        "From": "+14155550199",
        "StatusCallback": "https://clarion.test/hooks/twilio",
    }
    assert re.fullmatch(r"SM[0-9a-f]{32}", result.provider_message_id)
    assert result.provider == "twilio"
    assert result.segments == 1
    assert result.http_status == 201


async def test_long_message_reports_segments_from_twilio(fake: FakeTwilio, provider: TwilioProvider) -> None:
    body = "x" * 400

    result = await provider.send(make_message(Channel.sms, body=body))

    assert result.segments == num_segments(body) == 3


async def test_messaging_service_replaces_from_and_api_key_authenticates(fake: FakeTwilio) -> None:
    settings = settings_for(
        fake,
        auth_token=None,
        from_number=None,
        api_key_sid=fake.api_key_sid,
        api_key_secret=fake.api_key_secret,
        messaging_service_sid="MG" + "0" * 32,
    )
    provider = TwilioProvider(settings)
    try:
        result = await provider.send(make_message(Channel.sms))
    finally:
        await provider.aclose()

    body = fake.requests[0].body
    assert body["MessagingServiceSid"] == "MG" + "0" * 32
    assert "From" not in body
    assert result.segments == 1


async def test_expiring_message_sets_validity_period(fake: FakeTwilio, provider: TwilioProvider) -> None:
    expires_at = datetime.now(UTC) + timedelta(minutes=10)

    await provider.send(make_message(Channel.sms, expires_at=expires_at))

    assert 590 <= int(fake.requests[0].body["ValidityPeriod"]) <= 600


@pytest.mark.parametrize("code", [21211, 21614, 21610, 21612, 21635])
async def test_undeliverable_number_raises_invalid_recipient(
    fake: FakeTwilio, provider: TwilioProvider, code: int
) -> None:
    fake.fail_number("+14155550100", code)

    with pytest.raises(InvalidRecipient) as caught:
        await provider.send(make_message(Channel.sms))

    assert caught.value.code == str(code)
    assert caught.value.http_status == 400


@pytest.mark.parametrize("code", [21606, 21608])
async def test_sender_configuration_error_raises_permanent(
    fake: FakeTwilio, provider: TwilioProvider, code: int
) -> None:
    fake.fail_number("+14155550100", code)

    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(make_message(Channel.sms))

    assert type(caught.value) is PermanentProviderError
    assert caught.value.code == str(code)


async def test_bad_credentials_raise_permanent_20003(fake: FakeTwilio) -> None:
    provider = TwilioProvider(settings_for(fake, auth_token="wrong"))
    try:
        with pytest.raises(PermanentProviderError) as caught:
            await provider.send(make_message(Channel.sms))
    finally:
        await provider.aclose()

    assert type(caught.value) is PermanentProviderError
    assert (caught.value.code, caught.value.http_status) == ("20003", 401)


async def test_too_many_requests_raises_transient_with_retry_after(
    fake: FakeTwilio, provider: TwilioProvider
) -> None:
    fake.force_rate_limit(retry_after_s=9)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(make_message(Channel.sms))

    assert (caught.value.code, caught.value.http_status, caught.value.retry_after_s) == ("20429", 429, 9.0)


async def test_server_error_raises_transient(fake: FakeTwilio, provider: TwilioProvider) -> None:
    fake.force_server_error(status=500)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(make_message(Channel.sms))

    assert caught.value.http_status == 500
    assert caught.value.retry_after_s is None
    assert len(fake.requests) == 1


async def test_timeout_raises_transient(fake: FakeTwilio, provider: TwilioProvider) -> None:
    fake.force_timeout(delay_s=2)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(make_message(Channel.sms))

    assert caught.value.code == "timeout"


async def test_sends_reuse_one_pooled_connection(fake: FakeTwilio, provider: TwilioProvider) -> None:
    for _ in range(5):
        await provider.send(make_message(Channel.sms))

    assert fake.connections_opened == 1


async def test_aclose_then_send_opens_a_new_pool(fake: FakeTwilio, provider: TwilioProvider) -> None:
    await provider.send(make_message(Channel.sms))
    await provider.aclose()

    await provider.send(make_message(Channel.sms))

    assert fake.connections_opened == 2
