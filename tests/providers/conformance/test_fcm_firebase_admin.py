"""The FCM fake driven by firebase-admin, with a generated service-account key whose ``token_uri``
is the fake's OAuth endpoint (no network): it must agree with every answer."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import firebase_admin
import pytest
import requests.adapters
from firebase_admin import _http_client, credentials, exceptions, messaging

from harness.fakes.fcm import FakeFcm
from tests.fixtures.provider_fakes import running_fake

fake = running_fake(FakeFcm)


@pytest.fixture
def app(fake: FakeFcm) -> Iterator[firebase_admin.App]:
    cred = credentials.Certificate(fake.service_account_info())
    application = firebase_admin.initialize_app(cred, name=str(uuid.uuid4()))
    # firebase-admin's endpoint is only overridable through a private attribute.
    service = messaging._get_messaging_service(application)
    service._fcm_url = f"{fake.url}/v1/projects/{fake.project_id}/messages:send"
    # The SDK's own retry policy, without its exponential back-off (keeps the suite in seconds).
    retry = _http_client.DEFAULT_RETRY_CONFIG.new(backoff_factor=0)
    service._client.session.mount("http://", requests.adapters.HTTPAdapter(max_retries=retry))
    yield application
    firebase_admin.delete_app(application)


async def send(app: firebase_admin.App, message: messaging.Message, **kwargs: Any) -> str:
    return await asyncio.to_thread(messaging.send, message, app=app, **kwargs)


async def test_send_to_token_and_topic_return_a_name(fake: FakeFcm, app: firebase_admin.App) -> None:
    by_token = await send(app, messaging.Message(fid="t1", data={"k": "v"}))
    by_topic = await send(app, messaging.Message(topic="news", notification=messaging.Notification("a", "b")))

    assert by_token.startswith("projects/") and by_topic.startswith("projects/")
    assert fake.token_requests == 1, "the access token is reused"


async def test_dry_run_is_validate_only(fake: FakeFcm, app: firebase_admin.App) -> None:
    await send(app, messaging.Message(fid="t1"), dry_run=True)

    assert fake.delivered == []


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("UNREGISTERED", messaging.UnregisteredError),
        ("SENDER_ID_MISMATCH", messaging.SenderIdMismatchError),
        ("QUOTA_EXCEEDED", messaging.QuotaExceededError),
        ("UNAVAILABLE", exceptions.UnavailableError),
        ("THIRD_PARTY_AUTH_ERROR", messaging.ThirdPartyAuthError),
    ],
)
async def test_error_codes_map_to_the_sdk_classes(
    fake: FakeFcm, app: firebase_admin.App, code: str, error: type[Exception]
) -> None:
    fake.fail_token("t1", code)

    with pytest.raises(error):
        await send(app, messaging.Message(fid="t1"))


async def test_reserved_data_key_is_invalid_argument(app: firebase_admin.App) -> None:
    with pytest.raises(exceptions.InvalidArgumentError, match="from"):
        await send(app, messaging.Message(fid="t1", data={"from": "alice"}))


async def test_a_refused_access_token_is_refreshed_and_the_send_retried(
    fake: FakeFcm, app: firebase_admin.App
) -> None:
    await send(app, messaging.Message(fid="t1"))
    fake.expire_access_tokens()

    name = await send(app, messaging.Message(fid="t1"))

    assert name.startswith("projects/")
    assert fake.token_requests == 2
    assert len(fake.delivered) == 2


async def test_rate_limit_retry_after_is_honoured_by_the_sdk(fake: FakeFcm, app: firebase_admin.App) -> None:
    fake.force_rate_limit(1, retry_after_s=1)
    started = time.monotonic()

    await send(app, messaging.Message(fid="f1"))

    assert time.monotonic() - started >= 1.0
    assert len(fake.requests) == 2 and len(fake.delivered) == 1
