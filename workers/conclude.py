"""Conclude: the outcome of one notification's provider calls, as a pure function of what happened.

``conclude`` decides, in this order (the first that applies):

- ``sent`` when any address was delivered (one provider message id per delivered address);
- ``retrying`` at the earliest reopen time when no call could be made (every breaker open, or no
  provider for any address) and no call failed transiently: a breaker refusal uses no attempt;
- ``failed`` when every failure was permanent (the last error's code and message);
- ``dead`` once the transient failures used the last of ``max_attempts``;
- ``retrying`` at the retry schedule's next time (never before a provider's Retry-After, nor
  before a breaker that also refused reopens);
- and any rescheduled outcome becomes ``expired`` when its next try would come after
  ``expires_at`` (``unless_expired``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from providers.base import SendResult
from providers.errors import ProviderError, TransientProviderError
from schema.enums import Status
from workers.breaker import CircuitOpen
from workers.claim import ClaimedNotification
from workers.outcome import Attempt, Outcome
from workers.retry import RetryPolicy


@dataclass(slots=True)
class Calls:
    """What sending one notification to its addresses did: filled in by ``workers.send``."""

    attempts: list[Attempt] = field(default_factory=list)
    results: list[SendResult] = field(default_factory=list)
    errors: list[ProviderError] = field(default_factory=list)
    opened: list[CircuitOpen] = field(default_factory=list)


def conclude(
    *, notification: ClaimedNotification, calls: Calls, policy: RetryPolicy, now: datetime
) -> Outcome:
    """The outcome of ``calls`` (see the module docstring for the rules, in order)."""
    attempts, n = tuple(calls.attempts), len(calls.attempts)
    if calls.results:
        return Outcome(
            notification_id=notification.id,
            status=Status.sent,
            calls=n,
            provider=calls.results[0].provider,
            provider_message_id=",".join(r.provider_message_id for r in calls.results),
            attempts=attempts,
        )
    transient = [e for e in calls.errors if isinstance(e, TransientProviderError)]
    if not calls.errors or (not transient and calls.opened):
        last_open = calls.opened[-1] if calls.opened else None
        waits = [o.until for o in calls.opened] or [now + timedelta(seconds=policy.retry_base_s)]
        waiting = Outcome(
            notification_id=notification.id,
            status=Status.retrying,
            calls=n,
            provider=last_open.provider if last_open else None,
            error_code="circuit_open",
            error_message=str(last_open) if last_open else "no provider call was possible",
            not_before=min(waits),
            attempts=attempts,
        )
        return unless_expired(notification, waiting)
    last = calls.errors[-1]
    if not transient:
        return Outcome(
            notification_id=notification.id,
            status=Status.failed,
            calls=n,
            provider=last.provider,
            error_code=last.code,
            error_message=last.message,
            attempts=attempts,
        )
    total = notification.attempts + n
    failing = Outcome(
        notification_id=notification.id,
        status=Status.dead,
        calls=n,
        provider=last.provider,
        error_code=transient[-1].code,
        error_message=transient[-1].message,
        detail=f"gave up after {total} attempts",
        attempts=attempts,
    )
    if policy.exhausted(total):
        return failing
    hint = max((e.retry_after_s or 0.0 for e in transient), default=0.0)
    not_before = now + timedelta(seconds=policy.next_delay_s(total, hint))
    if calls.opened:
        not_before = max(not_before, min(o.until for o in calls.opened))
    detail = f"attempt {total} failed; next try not before {not_before.isoformat()}"
    return unless_expired(
        notification, replace(failing, status=Status.retrying, not_before=not_before, detail=detail)
    )


def unless_expired(notification: ClaimedNotification, outcome: Outcome) -> Outcome:
    """``outcome``, or ``expired`` when its next try would come after the notification's
    ``expires_at``."""
    expires_at = notification.expires_at
    if expires_at is None or outcome.not_before is None or outcome.not_before < expires_at:
        return outcome
    return replace(
        outcome,
        status=Status.expired,
        not_before=None,
        detail=(
            f"the next try ({outcome.not_before.isoformat()}) would come after expires_at; "
            f"last error {outcome.error_code}"
        ),
    )
