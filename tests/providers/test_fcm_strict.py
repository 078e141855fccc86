"""The FCM fake refuses what real FCM refuses, and FcmProvider never sends it."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from harness.fakes import make_message
from harness.fakes.fcm import FakeFcm
from providers.errors import PermanentProviderError
from providers.fcm import FcmProvider
from schema.enums import Channel, Priority
from tests.fixtures.provider_fakes import adapter_for, running_fake
from tests.fixtures.provider_settings import fcm_settings

fake = running_fake(FakeFcm)


provider = adapter_for(lambda fake: FcmProvider(fcm_settings(fake)))


async def post(fake: FakeFcm, provider: FcmProvider, document: Any) -> tuple[int, dict[str, Any]]:
    token = await provider.access_token()
    url = f"{fake.url}/v1/projects/{fake.project_id}/messages:send"
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=document, headers={"Authorization": f"Bearer {token}"}) as r:
            assert r.content_type == "application/json"
            return r.status, await r.json()


@pytest.mark.parametrize(
    "message",
    [
        {"token": "t", "data": {"from": "alice"}},
        {"token": "t", "data": {"message_type": "x"}},
        {"token": "t", "data": {"google.c.a": "x"}},
        {"token": "t", "data": {"gcm.notification.body": "x"}},
        {"token": "t", "data": {"googleId": "x"}},
        {"token": "t", "data": {"gcm_x": "x"}},
        {"token": "t", "data": ["a", "b"]},
        {"token": "t", "android": "high"},
        {"token": "t", "android": {"ttl": 3600}},
        {"token": "t", "android": {"ttl": "1h"}},
        {"token": "t", "notifcation": {"body": "typo"}},
        {"token": "t", "notification": {"body": "x", "sound": "default"}},
        {"topic": "news/sport"},
        {"topic": "news sport"},
        {"token": "t", "fid": "f"},
        {"token": "t", "data": {"k": "v"}, "apns": {"headers": {"apns-priority": "10"}}},
        {"token": "t", "apns": {"headers": {"apns-priority": 10}}},
    ],
)
async def test_fake_refuses_what_fcm_refuses_with_invalid_argument(
    fake: FakeFcm, provider: FcmProvider, message: dict[str, Any]
) -> None:
    status, body = await post(fake, provider, {"message": message})

    assert status == 400
    assert body["error"]["status"] == "INVALID_ARGUMENT"
    assert body["error"]["details"][0]["errorCode"] == "INVALID_ARGUMENT"
    assert fake.delivered == []


async def test_fake_refuses_unknown_top_level_field(fake: FakeFcm, provider: FcmProvider) -> None:
    status, body = await post(fake, provider, {"message": {"token": "t"}, "dry_run": True})

    assert (status, body["error"]["status"]) == (400, "INVALID_ARGUMENT")


@pytest.mark.parametrize(
    "message",
    [
        {"fid": "cXk9fid"},
        {"topic": "news-sport_1.x~%20"},
        {"condition": "'a' in topics"},
        {"token": "t", "data": {"k": "v"}, "apns": {"headers": {"apns-priority": "5"}}},
        {"token": "t", "notification": {"body": "x"}, "apns": {"headers": {"apns-priority": "10"}}},
    ],
)
async def test_fake_accepts_valid_targets_and_background_priority(
    fake: FakeFcm, provider: FcmProvider, message: dict[str, Any]
) -> None:
    status, body = await post(fake, provider, {"message": message})

    assert status == 200, body
    assert fake.delivered == [message]


async def test_validate_only_delivers_nothing(fake: FakeFcm, provider: FcmProvider) -> None:
    status, body = await post(fake, provider, {"message": {"token": "t"}, "validate_only": True})

    assert status == 200 and body["name"].startswith("projects/")
    assert fake.delivered == []


@pytest.mark.parametrize(
    "key", ["from", "message_type", "google.x", "gcm.notification.title", "googleId", "gcm_x"]
)
async def test_adapter_refuses_reserved_data_key_before_calling(
    fake: FakeFcm, provider: FcmProvider, key: str
) -> None:
    message = make_message(Channel.push, to="tok", platform="fcm", data={"ok": "1", key: "v"})

    with pytest.raises(PermanentProviderError, match=key) as caught:
        await provider.send(message)

    assert caught.value.code == "reserved_data_key"
    assert fake.requests == []


@pytest.mark.parametrize("priority", [Priority.normal, Priority.high])
async def test_adapter_alert_with_data_is_accepted_by_strict_fake(
    fake: FakeFcm, provider: FcmProvider, priority: Priority
) -> None:
    message = make_message(
        Channel.push, to="tok", platform="fcm", priority=priority, data={"order": "42", "kind": "x"}
    )

    await provider.send(message)

    assert fake.delivered[0]["data"] == {"order": "42", "kind": "x"}
    assert fake.delivered[0]["token"] == "tok"


async def test_adapter_sends_fid_target_for_fid_address(fake: FakeFcm, provider: FcmProvider) -> None:
    await provider.send(make_message(Channel.push, to="fid:cXk9abc", platform="fcm"))

    assert fake.delivered[0]["fid"] == "cXk9abc" and "token" not in fake.delivered[0]
