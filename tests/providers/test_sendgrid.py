"""SendGridProvider against the local Mail Send fake."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from functools import partial

import pytest
from sendgrid.helpers.eventwebhook import EventWebhook

from harness.fakes import make_message
from harness.fakes.sendgrid import FakeSendGrid
from harness.services import wait_until
from providers.errors import InvalidRecipient, PermanentProviderError, TransientProviderError
from providers.sendgrid import SendGridProvider
from providers.settings import SendGridSettings
from schema.enums import Channel
from tests.fixtures.provider_fakes import adapter_for, running_fake, send_raises
from tests.fixtures.provider_settings import sendgrid_settings
from tests.fixtures.receiver import Receiver

fake = running_fake(FakeSendGrid)


settings_for = partial(
    sendgrid_settings, timeout_s=0.5, from_name="Clarion"
)  # short: the timeout tests wait it out


provider = adapter_for(lambda fake: SendGridProvider(settings_for(fake)))


async def test_send_posts_mail_send_json_and_returns_message_id(
    fake: FakeSendGrid, provider: SendGridProvider
) -> None:
    message = make_message(Channel.email, unsubscribe_url="https://clarion.test/u/opaque", category="builds")

    result = await provider.send(message)

    [request] = fake.requests
    assert request.path == "/v3/mail/send"
    assert request.headers["authorization"] == f"Bearer {fake.api_key}"
    assert request.headers["content-type"] == "application/json"
    assert request.body["personalizations"] == [{"to": [{"email": "ada@example.com"}]}]
    assert request.body["from"] == {"email": "noreply@clarion.test", "name": "Clarion"}
    assert request.body["subject"] == "Build finished"
    assert request.body["content"] == [
        {"type": "text/plain", "value": "main is green"},
        {"type": "text/html", "value": "<p>main is green</p>"},
    ]
    assert request.body["categories"] == ["builds"]
    assert request.body["custom_args"] == {
        "notification_id": str(message.notification_id),
        "tenant_id": "acme",
    }
    assert request.body["headers"] == {
        "List-Unsubscribe": "<https://clarion.test/u/opaque>",
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
    }
    assert "mail_settings" not in request.body
    assert result.provider == "sendgrid"
    assert result.http_status == 202
    assert len(result.provider_message_id) == 22


async def test_plain_text_message_without_unsubscribe_has_no_html_or_headers(
    fake: FakeSendGrid, provider: SendGridProvider
) -> None:
    await provider.send(make_message(Channel.email, html=None))

    body = fake.requests[0].body
    assert body["content"] == [{"type": "text/plain", "value": "main is green"}]
    assert "headers" not in body


async def test_sandbox_mode_asks_sendgrid_to_validate_only(fake: FakeSendGrid) -> None:
    provider = SendGridProvider(settings_for(fake, sandbox_mode=True))
    try:
        result = await provider.send(make_message(Channel.email))
    finally:
        await provider.aclose()

    assert fake.requests[0].body["mail_settings"] == {"sandbox_mode": {"enable": True}}
    assert result.http_status == 200


async def test_rate_limit_raises_transient_with_seconds_until_reset(
    fake: FakeSendGrid, provider: SendGridProvider
) -> None:
    fake.force_rate_limit(retry_after_s=30)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(make_message(Channel.email))

    assert caught.value.http_status == 429
    assert caught.value.code == "http_429"
    assert caught.value.retry_after_s is not None
    assert 28 <= caught.value.retry_after_s <= 30


async def test_server_error_raises_transient_with_retry_after(
    fake: FakeSendGrid, provider: SendGridProvider
) -> None:
    fake.force_server_error(status=503, retry_after_s=12)
    started = time.monotonic()

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(make_message(Channel.email))

    assert caught.value.http_status == 503
    assert caught.value.retry_after_s == 12
    assert time.monotonic() - started < 1, "the provider must not sleep or retry"
    assert len(fake.requests) == 1


async def test_server_error_without_retry_after_gives_no_hint_despite_rate_limit_headers(
    fake: FakeSendGrid, provider: SendGridProvider
) -> None:
    """SendGrid sends X-RateLimit-Reset on every response; on a 5xx it is not a retry hint, or a
    503 would push the next try a minute out and skip the in-process retries."""
    fake.force_server_error(status=503)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(make_message(Channel.email))

    assert caught.value.retry_after_s is None


async def test_invalid_recipient_address_raises_invalid_recipient(
    fake: FakeSendGrid, provider: SendGridProvider
) -> None:
    fake.fail_email("bounce@example.com")

    with pytest.raises(InvalidRecipient) as caught:
        await provider.send(make_message(Channel.email, to="bounce@example.com"))

    assert caught.value.http_status == 400


async def test_unverified_sender_raises_permanent_not_invalid_recipient(
    fake: FakeSendGrid, provider: SendGridProvider
) -> None:
    fake.fail_email(
        "ada@example.com",
        status=403,
        message="The from address does not match a verified Sender Identity.",
        field="from",
    )

    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(make_message(Channel.email))

    assert type(caught.value) is PermanentProviderError
    assert caught.value.code == "http_403"


async def test_rejected_api_key_raises_permanent(fake: FakeSendGrid) -> None:
    caught = await send_raises(
        PermanentProviderError,
        SendGridProvider(settings_for(fake, api_key="SG.revoked")),
        make_message(Channel.email),
    )

    assert type(caught.value) is PermanentProviderError
    assert caught.value.http_status == 401


async def test_message_without_subject_is_refused_before_sending(
    fake: FakeSendGrid, provider: SendGridProvider
) -> None:
    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(make_message(Channel.email, subject=None))

    assert caught.value.code == "missing_subject"
    assert fake.requests == []


async def test_timeout_raises_transient(fake: FakeSendGrid, provider: SendGridProvider) -> None:
    fake.force_timeout(delay_s=2)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(make_message(Channel.email))

    assert caught.value.code == "timeout"


async def test_connection_refused_raises_transient() -> None:
    provider = SendGridProvider(
        SendGridSettings(api_key="SG.x", from_email="a@b.test", base_url="http://127.0.0.1:9", timeout_s=1)
    )
    try:
        with pytest.raises(TransientProviderError) as caught:
            await provider.send(make_message(Channel.email))
    finally:
        await provider.aclose()

    assert caught.value.code == "connection_error"


async def test_sends_reuse_one_pooled_connection(fake: FakeSendGrid, provider: SendGridProvider) -> None:
    for _ in range(5):
        await provider.send(make_message(Channel.email))

    assert len(fake.requests) == 5
    assert fake.connections_opened == 1


async def test_content_that_starts_like_an_api_key_is_refused_before_sending(
    fake: FakeSendGrid, provider: SendGridProvider
) -> None:
    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(make_message(Channel.email, body="SG.abcdef.ghijkl is your key"))

    assert caught.value.code == "api_key_in_content"
    assert fake.requests == []


# --- Event Webhook from the fake ---------------------------------------------------------------------


@pytest.fixture
async def receiver(fake: FakeSendGrid) -> AsyncIterator[Receiver]:
    async with Receiver(status=200) as server:
        fake.webhook_url = f"{server.url}/v1/webhooks/sendgrid/events"
        fake.webhook_delay_s = 0.01
        yield server


async def test_fake_posts_a_signed_event_batch_naming_the_notification(
    fake: FakeSendGrid, provider: SendGridProvider, receiver: Receiver
) -> None:
    message = make_message(Channel.email)

    result = await provider.send(message)
    await wait_until(lambda: receiver.requests, timeout_s=5)

    [post] = receiver.requests
    verifier = EventWebhook()
    key = verifier.convert_public_key_to_ecdsa(fake.public_key)
    signature = post.headers["x-twilio-email-event-webhook-signature"]
    timestamp = post.headers["x-twilio-email-event-webhook-timestamp"]
    assert verifier.verify_signature(post.raw.decode(), signature, timestamp, key)
    assert not verifier.verify_signature(post.raw.decode() + " ", signature, timestamp, key)
    assert [e["event"] for e in post.body] == ["processed", "delivered"]
    for event in post.body:
        assert event["notification_id"] == str(message.notification_id)
        assert event["email"] == "ada@example.com"
        assert event["sg_message_id"].startswith(result.provider_message_id)
    assert len({e["sg_event_id"] for e in post.body}) == 2


async def test_fake_reports_a_bounce_for_a_bouncing_address(
    fake: FakeSendGrid, provider: SendGridProvider, receiver: Receiver
) -> None:
    fake.bounce_email("gone@example.com")

    await provider.send(make_message(Channel.email, to="gone@example.com"))
    await wait_until(lambda: receiver.requests, timeout_s=5)

    final = receiver.requests[0].body[-1]
    assert (final["event"], final["type"]) == ("bounce", "bounce") and final["reason"].startswith("550")


async def test_fake_sends_no_events_in_sandbox_mode(fake: FakeSendGrid, receiver: Receiver) -> None:
    provider = SendGridProvider(settings_for(fake, sandbox_mode=True))
    try:
        await provider.send(make_message(Channel.email))
    finally:
        await provider.aclose()
    await fake.events_settled()  # events are scheduled before the fake answers the send

    assert fake.event_posts == [] and receiver.requests == []
