"""FcmProvider against the local FCM HTTP v1 + OAuth2 token endpoint fake."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest

from harness.fakes import make_message
from harness.fakes.fcm import FakeFcm
from providers.base import RenderedMessage
from providers.errors import (
    InvalidRecipient,
    PermanentProviderError,
    QuotaExceeded,
    TransientProviderError,
)
from providers.fcm import MAX_ANDROID_TTL_S, FcmProvider
from schema.enums import Channel, Priority
from tests.fixtures.provider_fakes import adapter_for, running_fake, send_raises
from tests.fixtures.provider_settings import fcm_settings

TOKEN = "fcm-registration-token-1"


fake = running_fake(FakeFcm)


settings_for = partial(fcm_settings, timeout_s=0.5)  # short: the timeout tests wait it out


provider = adapter_for(lambda fake: FcmProvider(settings_for(fake)))


def push(**overrides: Any) -> RenderedMessage:
    return make_message(Channel.push, **{"to": TOKEN, "platform": "fcm", **overrides})


async def test_send_posts_v1_message_with_bearer_token_and_returns_name(
    fake: FakeFcm, provider: FcmProvider
) -> None:
    expires_at = datetime.now(UTC) + timedelta(hours=1)
    message = push(
        priority=Priority.high, data={"kind": "build"}, collapse_id="builds", expires_at=expires_at
    )

    result = await provider.send(message)

    [request] = fake.sent("messages:send")
    assert request.path == "/v1/projects/clarion-test/messages:send"
    assert request.headers["authorization"].startswith("Bearer ya29.fake-")
    body = request.body["message"]
    assert body["token"] == TOKEN
    assert body["notification"] == {"title": "Build finished", "body": "main is green"}
    assert body["data"] == {"kind": "build"}
    assert body["android"]["priority"] == "HIGH"
    assert body["android"]["collapse_key"] == "builds"
    assert 3590 <= int(body["android"]["ttl"].removesuffix("s")) <= 3600
    assert body["apns"]["headers"]["apns-priority"] == "10"
    assert body["apns"]["headers"]["apns-collapse-id"] == "builds"
    assert body["apns"]["headers"]["apns-expiration"] == str(int(expires_at.timestamp()))
    assert result.provider_message_id.startswith("projects/clarion-test/messages/0:")
    assert (result.provider, result.http_status) == ("fcm", 200)


async def test_normal_priority_without_extras_sends_minimal_message(
    fake: FakeFcm, provider: FcmProvider
) -> None:
    await provider.send(push(priority=Priority.bulk))

    body = fake.sent("messages:send")[0].body["message"]
    assert body["android"] == {"priority": "NORMAL"}
    assert body["apns"] == {"headers": {"apns-priority": "5"}}
    assert "data" not in body


async def test_project_id_setting_overrides_the_service_account(fake: FakeFcm) -> None:
    caught = await send_raises(
        PermanentProviderError, FcmProvider(settings_for(fake, project_id="other-project")), push()
    )

    assert fake.sent("messages:send")[0].path == "/v1/projects/other-project/messages:send"
    assert caught.value.code == "PERMISSION_DENIED"


async def test_access_token_is_fetched_once_for_many_concurrent_sends(
    fake: FakeFcm, provider: FcmProvider
) -> None:
    await asyncio.gather(*(provider.send(push()) for _ in range(50)))
    await provider.send(push())

    assert fake.token_requests == 1
    assert provider.token_fetches == 1
    assert len({r.headers["authorization"] for r in fake.sent("messages:send")}) == 1


async def test_rejected_access_token_is_refreshed_once_and_the_send_succeeds(
    fake: FakeFcm, provider: FcmProvider
) -> None:
    await provider.send(push())
    fake.expire_access_tokens()

    result = await asyncio.gather(*(provider.send(push()) for _ in range(5)))

    assert all(r.provider_message_id for r in result)
    assert fake.token_requests == 2
    first, *rest = fake.sent("messages:send")
    assert len({r.headers["authorization"] for r in rest[-5:]}) == 1
    assert rest[-1].headers["authorization"] != first.headers["authorization"]


async def test_token_endpoint_refusing_the_assertion_raises_permanent(fake: FakeFcm) -> None:
    info = fake.service_account_info()
    info["client_email"] = "someone-else@clarion-test.iam.gserviceaccount.com"
    caught = await send_raises(
        PermanentProviderError, FcmProvider(settings_for(fake, service_account_json=json.dumps(info))), push()
    )

    assert caught.value.code == "oauth_refused"
    assert fake.sent("messages:send") == []


@pytest.mark.parametrize("error_code", ["UNREGISTERED", "INVALID_ARGUMENT", "SENDER_ID_MISMATCH"])
async def test_dead_registration_token_raises_invalid_recipient(
    fake: FakeFcm, provider: FcmProvider, error_code: str
) -> None:
    fake.fail_token(TOKEN, error_code)

    with pytest.raises(InvalidRecipient) as caught:
        await provider.send(push())

    assert caught.value.code == error_code


async def test_invalid_message_argument_raises_permanent_not_invalid_recipient(provider: FcmProvider) -> None:
    too_big = {"blob": "x" * 5000}

    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(push(data=too_big))

    assert type(caught.value) is PermanentProviderError
    assert (caught.value.code, caught.value.http_status) == ("INVALID_ARGUMENT", 400)


async def test_third_party_auth_error_raises_permanent_without_token_refresh(
    fake: FakeFcm, provider: FcmProvider
) -> None:
    fake.fail_token(TOKEN, "THIRD_PARTY_AUTH_ERROR")

    with pytest.raises(PermanentProviderError) as caught:
        await provider.send(push())

    assert type(caught.value) is PermanentProviderError
    assert caught.value.code == "THIRD_PARTY_AUTH_ERROR"
    assert fake.token_requests == 1


async def test_quota_exceeded_raises_quota_exceeded_with_retry_after(
    fake: FakeFcm, provider: FcmProvider
) -> None:
    fake.force_rate_limit(retry_after_s=60)

    with pytest.raises(QuotaExceeded) as caught:
        await provider.send(push())

    assert (caught.value.code, caught.value.http_status, caught.value.retry_after_s) == (
        "QUOTA_EXCEEDED",
        429,
        60,
    )


async def test_a_device_past_its_quota_is_refused_alone_with_the_projects_answer(
    fake: FakeFcm, provider: FcmProvider
) -> None:
    fake.device_quota_per_minute = 3
    for _ in range(3):
        await provider.send(push(to="busy-device"))

    with pytest.raises(QuotaExceeded) as caught:
        await provider.send(push(to="busy-device"))
    await provider.send(push(to="another-device"))

    # no Retry-After: FCM's minute before a quota's refusal is retried
    assert (caught.value.code, caught.value.http_status, caught.value.retry_after_s) == (
        "QUOTA_EXCEEDED",
        429,
        60,
    )
    assert [m["token"] for m in fake.delivered] == ["busy-device"] * 3 + ["another-device"]


async def test_the_projects_quota_named_as_such_is_the_providers_not_a_tenants(
    fake: FakeFcm, provider: FcmProvider
) -> None:
    """Google's quota layer names a project past its sends a minute (``google.rpc.ErrorInfo``,
    ``1/min/{project}``). Before, it was a plain transient error tried again within seconds; FCM
    asks for a minute. A ``QuotaExceeded`` would have charged it to one tenant alone."""
    fake.use_up_project_quota(1)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(push())
    await provider.send(push())

    assert type(caught.value) is TransientProviderError
    assert (caught.value.code, caught.value.http_status, caught.value.retry_after_s) == (
        "RESOURCE_EXHAUSTED",
        429,
        60,
    )
    assert len(fake.delivered) == 1


async def test_the_fakes_project_quota_leaves_queued_answers_and_goes_with_reset(
    fake: FakeFcm, provider: FcmProvider
) -> None:
    """Before, a send refused for the project's quota also took the next forced answer off the
    queue, and reset() left the refusals not yet answered for whatever came next."""
    fake.force_server_error(status=503)
    fake.use_up_project_quota(1)
    codes = []
    for _ in range(2):
        with pytest.raises(TransientProviderError) as caught:
            await provider.send(push())
        codes.append(caught.value.code)
    assert codes == ["RESOURCE_EXHAUSTED", "UNAVAILABLE"]

    fake.use_up_project_quota(5)
    fake.reset()
    await provider.send(push())
    assert len(fake.delivered) == 1


@pytest.mark.parametrize(("status", "error_code"), [(503, "UNAVAILABLE"), (500, "INTERNAL")])
async def test_server_error_raises_transient(
    fake: FakeFcm, provider: FcmProvider, status: int, error_code: str
) -> None:
    fake.force_server_error(status=status, retry_after_s=4)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(push())

    assert (caught.value.code, caught.value.http_status, caught.value.retry_after_s) == (
        error_code,
        status,
        4,
    )
    assert len(fake.sent("messages:send")) == 1


async def test_timeout_raises_transient(fake: FakeFcm, provider: FcmProvider) -> None:
    fake.force_timeout(delay_s=2)

    with pytest.raises(TransientProviderError) as caught:
        await provider.send(push())

    assert caught.value.code == "timeout"


async def test_sends_reuse_one_pooled_connection(fake: FakeFcm, provider: FcmProvider) -> None:
    for _ in range(5):
        await provider.send(push())

    assert len({r.peer for r in fake.sent("messages:send")}) == 1


async def test_an_expiry_past_four_weeks_sends_fcms_longest_ttl(fake: FakeFcm, provider: FcmProvider) -> None:
    """FCM refuses an Android ttl over 2,419,200 s; the strict fake does too (a 29-day expires_at
    failed every such push with INVALID_ARGUMENT until 2026-11-28)."""
    for days in (29, 3650):
        result = await provider.send(push(expires_at=datetime.now(UTC) + timedelta(days=days)))
        assert result.http_status == 200
    assert [r.body["message"]["android"]["ttl"] for r in fake.sent("messages:send")] == [
        f"{MAX_ANDROID_TTL_S}s"
    ] * 2


async def test_data_values_that_are_not_text_go_as_json(fake: FakeFcm, provider: FcmProvider) -> None:
    data = {"text": "x", "n": 3, "f": 1.5, "yes": True, "none": None, "nested": {"b": [1, None, True]}}
    await provider.send(push(data=data))
    [request] = fake.sent("messages:send")
    assert request.body["message"]["data"] == {
        "text": "x", "n": "3", "f": "1.5", "yes": "true", "none": "null", "nested": '{"b":[1,null,true]}'
    }  # fmt: skip
