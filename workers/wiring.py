"""Which screens and gates a channel worker runs, in order (see ``workers.steps``).

Each rule module contributes its step here; the pipeline itself never changes for a new rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg

from clarion.rules import RulesCache
from clarion.settings import Settings
from providers.errors import ProviderError
from providers.registry import ProviderSet
from schema.enums import Channel
from workers.claim import ClaimedNotification
from workers.content_dedupe import build_content_dedupe
from workers.email_tracking import EmailTracking
from workers.engagement_token import PushEventToken
from workers.preferences import PreferencesScreen
from workers.quiet_hours import QuietHoursScreen
from workers.steps import Gate, Screen
from workers.throttle import AdaptivePacing, ThrottleGate, provider_names, shared_rate_limiter


@dataclass
class Steps:
    screens: list[Screen] = field(default_factory=list)
    gates: list[Gate] = field(default_factory=list)
    unsubscribe_url: Callable[[ClaimedNotification], str | None] | None = None
    on_provider_error: Callable[[ProviderError], None] | None = None
    push_data: Callable[[ClaimedNotification], dict[str, str]] | None = None
    email_tracking: EmailTracking | None = None


def build_steps(*, settings: Settings, channel: Channel, pool: asyncpg.Pool, providers: ProviderSet) -> Steps:
    """The steps for ``channel``: screens run on the claimed batch, gates per notification."""
    steps = Steps()
    # Opt-out before quiet hours: an unwanted notification is suppressed, not held.
    preferences = PreferencesScreen(
        pool=pool,
        secret=settings.secret_key.get_secret_value(),
        base_url=settings.base_url,
        token_ttl_s=settings.preference_token_ttl_s,
    )
    steps.screens += [preferences, QuietHoursScreen(pool=pool)]
    steps.unsubscribe_url = preferences.unsubscribe_url
    # Content dedupe before throttling: a duplicate never uses up a cap or a provider slot.
    rules = RulesCache.from_pool(pool)
    pacing = AdaptivePacing()
    steps.gates += [
        build_content_dedupe(
            rules=rules, pool=pool, redis_url=settings.redis_url, key_prefix=settings.redis_key_prefix
        ),
        ThrottleGate(
            rules=rules,
            limiter=shared_rate_limiter(settings.redis_url, key_prefix=settings.redis_key_prefix),
            provider_name=provider_names(providers, channel),
            pacing=pacing,
        ),
    ]
    steps.on_provider_error = pacing.on_provider_error
    # Every push carries a token its device may use to report the open (POST /v1/device/events).
    steps.push_data = PushEventToken(
        secret=settings.secret_key.get_secret_value(), ttl_s=settings.engagement_token_ttl_s
    ).data
    if channel is Channel.email:
        steps.email_tracking = EmailTracking(
            pool=pool, secret=settings.secret_key.get_secret_value(), base_url=settings.base_url
        )
    return steps
