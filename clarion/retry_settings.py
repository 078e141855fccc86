"""Settings of delivery retries and circuit breakers (``CLARION_RETRY__*``); the mechanics live
in ``workers.retry`` and ``workers.breaker``."""

from __future__ import annotations

from pydantic import BaseModel, Field

from schema.enums import Channel


class BreakerSettings(BaseModel):
    """``CLARION_RETRY__BREAKER__<FIELD>``."""

    enabled: bool = Field(default=True, description="Use circuit breakers in front of providers.")
    failure_rate: float = Field(
        default=0.5, gt=0, le=1, description="Share of transient failures in the window that opens it."
    )
    window_s: float = Field(default=30.0, gt=0, description="Length of the rolling window, in seconds.")
    min_calls: int = Field(
        default=10, ge=1, description="Calls the window must hold before the failure rate is judged."
    )
    cool_down_s: float = Field(
        default=30.0, gt=0, description="How long an open breaker refuses calls before one probe."
    )


class RetrySettings(BaseModel):
    """``CLARION_RETRY__<FIELD>``: both retry tiers, per-channel attempt limits, the breakers."""

    in_process_attempts: int = Field(
        default=3, ge=1, description="Provider calls per delivery before rescheduling via the retry topic."
    )
    base_s: float = Field(
        default=0.05, gt=0, description="Base of the in-process exponential backoff, in seconds."
    )
    max_wait_s: float = Field(
        default=2.0,
        ge=0,
        description="Longest in-process wait between calls (also the cap on a provider's Retry-After "
        "honoured in-process; a longer hint reschedules instead).",
    )
    attempt_timeout_s: float = Field(
        default=10.0, gt=0, description="Timeout of one provider call, in seconds."
    )
    max_attempts: int = Field(
        default=8, ge=1, description="Provider calls before a notification is dead (any channel)."
    )
    max_attempts_push: int | None = Field(
        default=None, ge=1, description="Override of max_attempts for push."
    )
    max_attempts_sms: int | None = Field(default=None, ge=1, description="Override of max_attempts for SMS.")
    max_attempts_email: int | None = Field(
        default=None, ge=1, description="Override of max_attempts for email."
    )
    retry_base_s: float = Field(
        default=2.0, gt=0, description="Delay before the first scheduled retry (doubles each attempt)."
    )
    retry_max_s: float = Field(default=900.0, gt=0, description="Longest delay between scheduled retries.")
    hold_max_s: float = Field(
        default=5.0,
        ge=0,
        description="Longest the retry lane waits for a not-yet-due record before leaving it to the "
        "relay's not_before scan (bounds how long a retry partition is held).",
    )
    breaker: BreakerSettings = Field(
        default_factory=BreakerSettings, description="Per-provider circuit breakers."
    )

    def max_attempts_for(self, channel: Channel) -> int:
        """Provider calls a ``channel`` notification gets before it is dead."""
        override = {
            Channel.push: self.max_attempts_push,
            Channel.sms: self.max_attempts_sms,
            Channel.email: self.max_attempts_email,
        }[channel]
        return override or self.max_attempts
