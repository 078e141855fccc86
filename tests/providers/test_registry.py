"""build_providers: a channel with configured credentials routes to its real adapter, else the sandbox."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from clarion.sandbox_store import PgSandboxStore
from clarion.settings import Settings
from harness.fakes.apns import FakeApns
from harness.fakes.fcm import FakeFcm
from providers.apns import ApnsProvider
from providers.fcm import FcmProvider
from providers.registry import NoProviderConfigured, build_providers
from providers.sandbox import SandboxProvider
from providers.sendgrid import SendGridProvider
from providers.settings import ProvidersSettings
from providers.twilio import TwilioProvider
from schema.enums import Channel

STORE = PgSandboxStore("postgresql://unused")  # opens a pool on the first send only: none here

_SERVICE_ACCOUNT = json.dumps(FakeFcm().service_account_info())
_APNS_KEY = FakeApns().private_key_pem()
ACCOUNTS: dict[str, dict[str, Any]] = {
    "apns": {
        "key_id": "ABC123DEFG",
        "team_id": "TEAM123456",
        "topic": "com.clarion.app",
        "private_key": _APNS_KEY,
    },
    "fcm": {"service_account_json": _SERVICE_ACCOUNT},
    "twilio": {"account_sid": "AC" + "0" * 32, "auth_token": "secret", "from_number": "+14155550199"},
    "sendgrid": {"api_key": "SG.key", "from_email": "noreply@clarion.test"},
}
ROUTES = {
    "apns": ((Channel.push, "apns"), ApnsProvider),
    "fcm": ((Channel.push, "fcm"), FcmProvider),
    "twilio": ((Channel.sms, None), TwilioProvider),
    "sendgrid": ((Channel.email, None), SendGridProvider),
}


@pytest.mark.parametrize("account", list(ACCOUNTS))
async def test_configured_account_routes_its_channel_and_others_fall_back(account: str) -> None:
    providers = build_providers(
        ProvidersSettings.model_validate({account: ACCOUNTS[account]}), sandbox_store=STORE
    )
    (channel, platform), adapter = ROUTES[account]

    assert isinstance(providers.for_message(channel, platform), adapter)
    for other, ((other_channel, other_platform), _) in ROUTES.items():
        if other != account:
            assert isinstance(providers.for_message(other_channel, other_platform), SandboxProvider)
    await providers.aclose()


async def test_no_credentials_means_every_channel_uses_the_sandbox() -> None:
    providers = build_providers(ProvidersSettings(), sandbox_store=STORE)

    assert providers.routes == {}
    assert isinstance(providers.for_message(Channel.push, "apns"), SandboxProvider)


async def test_all_accounts_configured_route_every_channel() -> None:
    providers = build_providers(ProvidersSettings.model_validate(ACCOUNTS), sandbox_store=STORE)

    assert {route: type(p) for route, p in providers.routes.items()} == dict(ROUTES.values())
    await providers.aclose()


async def test_no_credentials_and_sandbox_disabled_raises_no_provider() -> None:
    providers = build_providers(
        ProvidersSettings.model_validate({"sandbox": {"enabled": False}}), sandbox_store=STORE
    )

    with pytest.raises(NoProviderConfigured):
        providers.for_message(Channel.sms)


@pytest.mark.parametrize(
    ("account", "partial"),
    [
        ("apns", {"key_id": "ABC123DEFG", "team_id": "TEAM123456"}),
        ("twilio", {"account_sid": "AC" + "0" * 32, "auth_token": "secret"}),
        ("sendgrid", {"api_key": "SG.key"}),
    ],
)
def test_partial_credentials_are_refused_at_startup(account: str, partial: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match="incomplete provider credentials"):
        ProvidersSettings.model_validate({account: partial})


def test_credentials_are_read_from_nested_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLARION_PROVIDERS__TWILIO__ACCOUNT_SID", "AC" + "1" * 32)
    monkeypatch.setenv("CLARION_PROVIDERS__TWILIO__AUTH_TOKEN", "token")
    monkeypatch.setenv("CLARION_PROVIDERS__TWILIO__MESSAGING_SERVICE_SID", "MG" + "2" * 32)
    monkeypatch.setenv("CLARION_PROVIDERS__SENDGRID__BASE_URL", "http://127.0.0.1:1")

    settings = Settings(env="test").providers

    assert settings.twilio.configured
    assert settings.twilio.auth_token is not None and settings.twilio.auth_token.get_secret_value() == "token"
    assert not settings.sendgrid.configured and settings.sendgrid.base_url == "http://127.0.0.1:1"
