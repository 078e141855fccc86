"""The settings of tenants' webhooks (``clarion webhooks``, the endpoints' routes): a part of
``clarion.settings.Settings``, which inherits them, so each is still ``CLARION_WEBHOOK_...``.

Checked together: a lease shorter than a call can take (its host's lookup, its time limit and a
margin) would let another claim send a live call again (``webhook_lease_floor_s``).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from core.ssrf import LOOKUP_TIMEOUT_S

# What a webhook lease holds beyond its call's lookup and time limit: recording the result, and an
# event loop slowed by a loaded machine.
WEBHOOK_LEASE_MARGIN_S = 5.0


def webhook_lease_floor_s(timeout_s: float) -> float:
    """The shortest lease under which a live ``clarion webhooks`` call of ``timeout_s`` is not
    taken by another claim mid-call (the host's lookup, the call, the margin)."""
    return LOOKUP_TIMEOUT_S + timeout_s + WEBHOOK_LEASE_MARGIN_S


def split_commas(value: object) -> object:
    """A comma-separated environment value as a list of its non-empty parts."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class WebhookSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CLARION_", env_nested_delimiter="__", extra="ignore")

    webhook_allow_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Operator allow-list (comma-separated host names, IPs or CIDR networks) of webhook endpoint hosts that may resolve to loopback, private, link-local or metadata addresses; every other such endpoint is refused at registration and at every send.",
    )
    max_webhook_endpoints_per_tenant: int = Field(
        default=10, ge=1, le=1000, description="Webhook endpoints one tenant may register."
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, le=120, description="Whole-request timeout of one webhook delivery, in seconds."
    )
    webhook_max_attempts: int = Field(
        default=15,
        ge=1,
        le=100,
        description="Calls a webhook delivery gets before it is given up (`failed`; a replay sends it again).",
    )
    webhook_retry_base_s: float = Field(
        default=5.0,
        gt=0,
        description="Delay before a webhook delivery's second call; doubles each call, with jitter.",
    )
    webhook_retry_max_s: float = Field(
        default=3600.0,
        gt=0,
        description="Longest delay between two calls of one webhook delivery, in seconds.",
    )
    webhook_lease_s: float = Field(
        default=60.0,
        gt=0,
        description="How long a webhooks process holds a claimed delivery before another may send it (a process killed mid-delivery loses nothing, the receiver may see it twice); at least CLARION_WEBHOOK_TIMEOUT_S + 7 s (the host's lookup and a margin), else a call still running would be sent again.",
    )
    webhook_disable_after_failures: int = Field(
        default=50,
        ge=1,
        description="Consecutive failed calls after which an endpoint is disabled (also needs webhook_disable_after_s of failing).",
    )
    webhook_disable_after_s: float = Field(
        default=3 * 24 * 3600.0,
        ge=0,
        description="How long an endpoint must have failed without a single success before it is disabled, in seconds.",
    )
    webhook_retention_days: int = Field(
        default=7,
        ge=1,
        le=366,
        description="Days webhook events and deliveries are kept (daily partitions, dropped whole); replay reaches this far back.",
    )
    webhook_poll_interval_s: float = Field(
        default=0.5, gt=0, description="How often `clarion webhooks` looks for due deliveries when idle."
    )
    webhook_concurrency: int = Field(
        default=32, ge=1, le=1000, description="Webhook calls one `clarion webhooks` process makes at once."
    )
    webhook_concurrency_per_tenant: int = Field(
        default=4,
        ge=1,
        le=1000,
        description="Of those, how many one tenant's deliveries may hold at once, so a tenant whose endpoints hang cannot delay another's.",
    )

    @field_validator("webhook_allow_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        return split_commas(value)

    @model_validator(mode="after")
    def _webhook_lease_outlasts_a_call(self) -> WebhookSettings:
        floor = webhook_lease_floor_s(self.webhook_timeout_s)
        if self.webhook_lease_s < floor:
            raise ValueError(
                f"CLARION_WEBHOOK_LEASE_S ({self.webhook_lease_s:g}) must be at least "
                f"CLARION_WEBHOOK_TIMEOUT_S + {floor - self.webhook_timeout_s:g} s ({floor:g}): a shorter "
                "lease ends while calls are still running, and they are sent again"
            )
        return self
