"""TwilioProvider against the local Messages API fake."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime, timedelta
from functools import partial

import aiohttp
import pytest
from twilio.request_validator import RequestValidator

from clarion.settings import Settings
from harness.fakes import make_message
from harness.fakes.twilio import FakeTwilio, num_segments
from harness.services import wait_until
from providers.errors import InvalidRecipient, PermanentProviderError, TransientProviderError
from providers.twilio import TwilioProvider
from schema.enums import Channel
from tests.fixtures.provider_fakes import adapter_for, running_fake, send_raises
from tests.fixtures.provider_settings import twilio_settings
from tests.fixtures.receiver import Receiver

fake = running_fake(FakeTwilio)


settings_for = partial(twilio_settings, timeout_s=0.5)  # short: the timeout tests wait it out


provider = adapter_for(
    lambda fake: TwilioProvider(settings_for(fake, status_callback_url="https://clarion.test/hooks/twilio"))
)


async def test_send_posts_form_with_basic_auth_and_returns_sid(
    fake: FakeTwilio, provider: TwilioProvider
) -> None:
    message = make_message(Channel.sms)
    result = await provider.send(message)

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
        "StatusCallback": f"https://clarion.test/hooks/twilio?notification_id={message.notification_id}",
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


# Twilio's error code for a number -> what the adapter raises: the recipient is dead (never retry
# them), or the sender is misconfigured (the account's problem, not this recipient's).
NUMBER_ERRORS = [(code, InvalidRecipient) for code in (21211, 21614, 21610, 21612, 21635)] + [
    (code, PermanentProviderError) for code in (21606, 21608)
]


@pytest.mark.parametrize(("code", "raised"), NUMBER_ERRORS)
async def test_a_refused_number_raises_the_error_its_code_means(
    fake: FakeTwilio, provider: TwilioProvider, code: int, raised: type[PermanentProviderError]
) -> None:
    fake.fail_number("+14155550100", code)

    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(make_message(Channel.sms))

    assert type(caught.value) is raised
    assert (caught.value.code, caught.value.http_status) == (str(code), 400)


async def test_bad_credentials_raise_permanent_20003(fake: FakeTwilio) -> None:
    caught = await send_raises(
        PermanentProviderError,
        TwilioProvider(settings_for(fake, auth_token="wrong")),
        make_message(Channel.sms),
    )

    assert type(caught.value) is PermanentProviderError
    assert (caught.value.code, caught.value.http_status) == ("20003", 401)


async def test_too_many_requests_raises_transient_without_a_retry_hint_as_twilio_sends_none(
    fake: FakeTwilio, provider: TwilioProvider
) -> None:
    fake.force_rate_limit(retry_after_s=9)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(make_message(Channel.sms))

    assert (caught.value.code, caught.value.http_status, caught.value.retry_after_s) == ("20429", 429, None)


async def test_too_many_requests_passes_on_a_retry_after_hint_when_one_is_sent(
    fake: FakeTwilio, provider: TwilioProvider
) -> None:
    fake.retry_after_hint = True
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


# --- status callbacks --------------------------------------------------------------------------------


def test_status_callbacks_setting_points_twilio_at_clarions_webhook() -> None:
    account = {"account_sid": "AC" + "1" * 32, "auth_token": "t", "from_number": "+14155550199"}
    on = Settings(
        env="test",
        public_url="https://clarion.example/",
        providers={"twilio": {**account, "status_callbacks": True}},
    )
    explicit = Settings(
        env="test",
        public_url="https://clarion.example",
        providers={
            "twilio": {**account, "status_callbacks": True, "status_callback_url": "https://x.test/cb"}
        },
    )
    off = Settings(env="test", public_url="https://clarion.example", providers={"twilio": account})

    assert on.providers.twilio.status_callback_url == "https://clarion.example/v1/webhooks/twilio/status"
    assert explicit.providers.twilio.status_callback_url == "https://x.test/cb"
    assert off.providers.twilio.status_callback_url is None


async def test_fake_posts_signed_sent_then_delivered_callbacks(fake: FakeTwilio) -> None:
    fake.callback_delay_s = 0.01
    async with Receiver() as receiver:
        url = f"{receiver.url}/v1/webhooks/twilio/status"
        provider = TwilioProvider(settings_for(fake, status_callback_url=url))
        try:
            message = make_message(Channel.sms)
            result = await provider.send(message)
            await wait_until(lambda: len(receiver.requests) == 2, timeout_s=5)
        finally:
            await provider.aclose()

    assert [r.body["MessageStatus"] for r in receiver.requests] == ["sent", "delivered"]
    validator = RequestValidator(fake.auth_token)
    url += f"?notification_id={message.notification_id}"  # Twilio signs the URL it calls, query included
    for request in receiver.requests:
        assert request.body["MessageSid"] == result.provider_message_id
        assert request.body["To"] == "+14155550100" and "ErrorCode" not in request.body
        assert validator.validate(url, request.body, request.headers["x-twilio-signature"])
        assert not RequestValidator("other").validate(
            url, request.body, request.headers["x-twilio-signature"]
        )


async def test_fake_reports_an_async_error_code_in_the_final_callback(fake: FakeTwilio) -> None:
    fake.callback_delay_s = 0.01
    fake.fail_number_async("+14155550123", 30005, status="failed")
    async with Receiver() as receiver:
        provider = TwilioProvider(settings_for(fake, status_callback_url=f"{receiver.url}/cb"))
        try:
            await provider.send(make_message(Channel.sms, to="+14155550123"))
            await wait_until(lambda: len(receiver.requests) == 2, timeout_s=5)
        finally:
            await provider.aclose()

    final = receiver.requests[-1].body
    assert (final["MessageStatus"], final["ErrorCode"]) == ("failed", "30005")


def test_status_callbacks_without_a_resolved_url_is_a_configuration_error(fake: FakeTwilio) -> None:
    with pytest.raises(ValueError, match="status_callback_url"):
        TwilioProvider(settings_for(fake, status_callbacks=True))


@pytest.mark.parametrize("to", ["whatsapp:+14155550100", "rcs:+14155550100"])
async def test_sms_to_a_channel_address_is_sent_from_the_same_channel(
    fake: FakeTwilio, provider: TwilioProvider, to: str
) -> None:
    result = await provider.send(make_message(Channel.sms, to=to))

    form = fake.requests[0].body
    assert result.http_status == 201
    assert form["To"] == to and form["From"].startswith(to.split(":")[0] + ":+")


@pytest.mark.parametrize(
    ("form", "status"),
    [
        ({"To": "whatsapp:+14155550100", "MediaUrl": "https://example.com/a.png"}, 201),
        ({"To": "+14155550100", "ContentSid": "HX" + "a" * 32}, 201),
        ({"To": "+14155550100", "ContentSid": "HX-not-a-sid"}, 400),
        ({"To": "whatsapp:+14155550100", "Body": "x", "From": "+15005550006"}, 400),
        ({"To": "whatsapp:14155550100", "Body": "x"}, 400),
        ({"To": "+14155550100"}, 400),
    ],
)
async def test_fake_accepts_media_and_content_only_and_refuses_mismatched_channels(
    fake: FakeTwilio, form: dict[str, str], status: int
) -> None:
    form = {"From": "whatsapp:+15005550006" if form["To"].startswith("whatsapp") else "+15005550006", **form}
    url = f"{fake.url}/2010-04-01/Accounts/{fake.account_sid}/Messages.json"
    auth = {"Authorization": aiohttp.BasicAuth(fake.account_sid, fake.auth_token).encode()}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, data=form, headers=auth) as response:
            assert response.status == status, await response.text()
