"""Users and devices: profiles are validated with clear errors; device registration is idempotent."""

from __future__ import annotations

import secrets
from typing import Any

import httpx
import pytest

from tests.fixtures.answers import assert_error
from tests.fixtures.sends import email_send

GRACE: dict[str, Any] = {
    "email": "grace@example.com",
    "phone": "+14155550123",
    "locale": "pt-BR",
    "timezone": "America/Sao_Paulo",
    "quiet_hours": {"start": "22:00", "end": "07:00"},
}


def profile(**overrides: Any) -> dict[str, Any]:
    """Grace's profile, with ``overrides`` replacing fields."""
    return {**GRACE, **overrides}


async def test_put_creates_then_replaces_the_profile(client: httpx.AsyncClient) -> None:
    created = await client.put("/v1/users/u-grace", json=profile())
    assert created.status_code == 201, created.text
    assert created.json()["quiet_hours"] == {"start": "22:00", "end": "07:00"}

    replaced = await client.put("/v1/users/u-grace", json=profile(phone=None, quiet_hours=None))
    assert replaced.status_code == 200, replaced.text

    read = (await client.get("/v1/users/u-grace")).json()
    assert read["id"] == "u-grace"
    assert read["email"] == "grace@example.com"
    assert read["timezone"] == "America/Sao_Paulo"
    assert read["phone"] is None and read["quiet_hours"] is None


async def test_unknown_user_is_404(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/users/nobody"), 404, "unknown_user")


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"timezone": "Mars/Olympus_Mons"}, "timezone", "IANA"),
        ({"phone": "4155550100"}, "phone", "E.164"),
        ({"email": "not-an-email"}, "email", "valid email"),
        ({"quiet_hours": {"start": "25:00", "end": "07:00"}}, "quiet_hours.start", "HH:MM"),
        ({"quiet_hours": {"start": "07:00", "end": "07:00"}}, "quiet_hours", "different"),
    ],
)
async def test_bad_profile_is_refused_with_the_field_named(
    client: httpx.AsyncClient, overrides: dict[str, Any], field: str, words: str
) -> None:
    error = assert_error(
        await client.put("/v1/users/u-bad", json=profile(**overrides)), 422, "validation_error"
    )
    assert error["details"][0]["field"] == field
    assert words in error["message"]
    assert_error(await client.get("/v1/users/u-bad"), 404, "unknown_user")


async def test_device_registration_is_idempotent_and_removal_deactivates(client: httpx.AsyncClient) -> None:
    await client.put("/v1/users/u-phone", json=profile())
    token = secrets.token_hex(32)
    first = await client.post("/v1/users/u-phone/devices", json={"platform": "apns", "token": token})
    again = await client.post("/v1/users/u-phone/devices", json={"platform": "apns", "token": token})
    assert (first.status_code, again.status_code) == (201, 200), (first.text, again.text)
    assert [d["token"] for d in (await client.get("/v1/users/u-phone")).json()["devices"]] == [token]

    removed = await client.delete(f"/v1/users/u-phone/devices/{token}")
    assert removed.status_code == 204
    [device] = (await client.get("/v1/users/u-phone")).json()["devices"]
    assert device["active"] is False
    # Nothing left to push to: a push send is refused at the API.
    refused = await client.post(
        "/v1/notifications", json=email_send(user=None, user_id="u-phone", channel="push")
    )
    assert_error(refused, 422, "no_device")

    revived = await client.post("/v1/users/u-phone/devices", json={"platform": "apns", "token": token})
    assert revived.status_code == 200 and revived.json()["active"] is True


@pytest.mark.parametrize(
    ("platform", "token"),
    [
        ("apns", "not-hex-" * 10),
        ("apns", "abcd1234"),
        ("fcm", "short"),
        ("fcm", "has spaces " * 5),
        ("webpush", "ab" * 32),  # 64 hex characters: a FCM or APNs token, not a web push subscription
    ],
)
async def test_device_token_format_is_checked_per_platform(
    client: httpx.AsyncClient, platform: str, token: str
) -> None:
    await client.put("/v1/users/u-dev", json=profile())
    response = await client.post("/v1/users/u-dev/devices", json={"platform": platform, "token": token})
    assert_error(response, 422, "validation_error")


async def test_fcm_token_is_accepted(client: httpx.AsyncClient) -> None:
    await client.put("/v1/users/u-fcm", json=profile())
    token = f"{secrets.token_urlsafe(16)}:APA91b{secrets.token_urlsafe(100)}"
    response = await client.post("/v1/users/u-fcm/devices", json={"platform": "fcm", "token": token})
    assert response.status_code == 201, response.text


async def test_devices_of_an_unknown_user_are_404(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/users/ghost/devices", json={"platform": "apns", "token": secrets.token_hex(32)}
    )
    assert_error(response, 404, "unknown_user")
    assert_error(await client.delete("/v1/users/ghost/devices/abc"), 404, "unknown_user")


async def test_a_send_only_key_writing_a_profile_is_not_shown_the_device_tokens(
    client: httpx.AsyncClient, api: Any, engine: Any, tenant: Any
) -> None:
    from harness.services import api_client
    from tests.conftest import make_tenant

    token = secrets.token_hex(32)
    await client.put("/v1/users/u-dev", json=profile())
    added = await client.post("/v1/users/u-dev/devices", json={"platform": "apns", "token": token})
    assert added.status_code in (200, 201), added.text
    sender = await make_tenant(engine, scopes=("send",), tenant_id=tenant.id)
    async with api_client(api.url, sender.key) as send_only:
        response = await send_only.put("/v1/users/u-dev", json={"email": "dev@example.com"})
    assert response.status_code == 200, response.text
    assert response.json()["devices"] == [] and token not in response.text
    full = (await client.get("/v1/users/u-dev")).json()
    assert [d["token"] for d in full["devices"]] == [token]
