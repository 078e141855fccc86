"""Which provider serves which channel (and, for push, which device platform).

An explicit table, not discovery: a channel whose real provider has credentials configured uses it;
otherwise the sandbox serves it (when enabled). Email may also have an SMTP relay configured: it is
the failover the pipeline tries when SendGrid's breaker is open or SendGrid keeps failing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from providers.apns import ApnsProvider
from providers.base import Provider
from providers.fcm import FcmProvider
from providers.sandbox import SandboxProvider, SandboxStore
from providers.sendgrid import SendGridProvider
from providers.settings import ProvidersSettings
from providers.smtp import SmtpProvider
from providers.twilio import TwilioProvider
from schema.enums import Channel, Platform

# route -> (the ProvidersSettings field holding the account, the adapter built from it)
REAL_PROVIDERS: dict[tuple[Channel, str | None], tuple[str, Callable[[Any], Provider]]] = {
    (Channel.push, Platform.apns.value): ("apns", ApnsProvider),
    (Channel.push, Platform.fcm.value): ("fcm", FcmProvider),
    (Channel.sms, None): ("twilio", TwilioProvider),
    (Channel.email, None): ("sendgrid", SendGridProvider),
}


class NoProviderConfigured(LookupError):
    """No real provider has credentials for this channel/platform and the sandbox is disabled."""


@dataclass
class ProviderSet:
    """The providers one worker process uses, keyed by ``(channel, platform or None)``."""

    routes: dict[tuple[Channel, str | None], Provider] = field(default_factory=dict)
    fallback: Provider | None = None
    failover: dict[Channel, Provider] = field(default_factory=dict)

    def for_message(self, channel: Channel, platform: str | None = None) -> Provider:
        provider = self.routes.get((channel, platform)) or self.routes.get((channel, None)) or self.fallback
        if provider is None:
            raise NoProviderConfigured(f"no provider configured for {channel.value} {platform or ''}".strip())
        return provider

    def failover_for(self, channel: Channel, primary: Provider) -> Provider | None:
        """The secondary provider to try when ``primary`` is failing (email: SMTP), or None."""
        secondary = self.failover.get(channel)
        return secondary if secondary is not None and secondary is not primary else None

    def all(self) -> list[Provider]:
        unique: dict[int, Provider] = {id(p): p for p in self.routes.values()}
        unique.update({id(p): p for p in self.failover.values()})
        if self.fallback is not None:
            unique[id(self.fallback)] = self.fallback
        return list(unique.values())

    async def aclose(self) -> None:
        for provider in self.all():
            await provider.aclose()


def build_providers(settings: ProvidersSettings, *, sandbox_store: SandboxStore | None = None) -> ProviderSet:
    """Build the provider set from settings: every account whose credentials are configured routes its
    channel; the sandbox (when enabled) serves the rest. Opens no connection: adapters connect lazily."""
    providers = ProviderSet()
    if settings.sandbox.enabled:
        if sandbox_store is None:
            raise ValueError("the sandbox is enabled: give build_providers a sandbox_store")
        providers.fallback = SandboxProvider(sandbox_store)
    for route, (field_name, factory) in REAL_PROVIDERS.items():
        account = getattr(settings, field_name)
        if account.configured:
            providers.routes[route] = factory(account)
    if settings.smtp.configured:
        smtp = SmtpProvider(settings.smtp)
        # Secondary behind SendGrid; the email route itself when SendGrid is not configured.
        providers.failover[Channel.email] = smtp
        providers.routes.setdefault((Channel.email, None), smtp)
    return providers
