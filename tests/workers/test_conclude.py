"""``conclude``: every (result, attempts, expiry, breaker) case, as a table.

Each row gives what the calls did and what must come of it. ``not_before`` is checked as a window
(the retry schedule has jitter: between half and all of ``retry_base_s * 2**(attempts-1)``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from providers.base import SendResult
from providers.errors import PermanentProviderError, ProviderError, TransientProviderError
from schema.enums import Status
from tests.fixtures.claimed import claimed
from workers.breaker import CircuitOpen
from workers.conclude import Calls, conclude
from workers.outcome import Attempt
from workers.retry import RetryPolicy

NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)
POLICY = RetryPolicy(retry_base_s=2.0, retry_max_s=900.0, max_attempts=8)


def transient(code: str = "http_503", retry_after_s: float | None = None) -> TransientProviderError:
    return TransientProviderError("unavailable", provider="sendgrid", code=code, retry_after_s=retry_after_s)


def permanent(code: str = "http_400") -> PermanentProviderError:
    return PermanentProviderError("refused", provider="sendgrid", code=code)


def opened(seconds: float, provider: str = "smtp") -> CircuitOpen:
    return CircuitOpen(provider, NOW + timedelta(seconds=seconds))


def calls_made(n: int) -> list[Attempt]:
    return [
        Attempt(notification_id=claimed().id, attempt=i + 1, provider="sendgrid", recipient="a@example.com",
                started_at=NOW, finished_at=NOW, outcome="transient")
        for i in range(n)
    ]  # fmt: skip


@dataclass
class Case:
    name: str
    status: Status
    code: str | None = None
    results: list[SendResult] = field(default_factory=list)
    errors: list[ProviderError] = field(default_factory=list)
    opened: list[CircuitOpen] = field(default_factory=list)
    calls: int = 1
    attempts_before: int = 0
    expires_in_s: float | None = None
    wait_s: tuple[float, float] | None = None  # not_before - NOW within [low, high]
    provider: str | None = None


CASES = [
    Case("delivered", Status.sent, results=[SendResult("sendgrid", "m-1")], provider="sendgrid"),
    Case("delivered to one address of two, the other refused", Status.sent,
         results=[SendResult("fcm", "m-2")], errors=[permanent()], calls=2, provider="fcm"),
    Case("every failure permanent", Status.failed, "http_400", errors=[permanent()], provider="sendgrid"),
    Case("no call possible: no provider and no breaker", Status.retrying, "circuit_open", calls=0,
         wait_s=(2.0, 2.0)),
    Case("every breaker open", Status.retrying, "circuit_open", opened=[opened(30), opened(10)], calls=0,
         wait_s=(10.0, 10.0), provider="smtp"),
    Case("a permanent refusal and an open breaker", Status.retrying, "circuit_open",
         errors=[permanent()], opened=[opened(5)], wait_s=(5.0, 5.0), provider="smtp"),
    Case("transient, first attempt", Status.retrying, "http_503", errors=[transient()],
         wait_s=(1.0, 2.0), provider="sendgrid"),
    Case("transient, fourth attempt: the schedule doubles", Status.retrying, "http_503",
         errors=[transient()], attempts_before=3, wait_s=(8.0, 16.0), provider="sendgrid"),
    Case("transient with a Retry-After longer than the schedule", Status.retrying, "http_429",
         errors=[transient("http_429", retry_after_s=60)], wait_s=(60.0, 60.0), provider="sendgrid"),
    Case("transient and a breaker open longer than the schedule", Status.retrying, "http_503",
         errors=[transient()], opened=[opened(120)], wait_s=(120.0, 120.0), provider="sendgrid"),
    Case("transient, the last attempt spent", Status.dead, "http_503", errors=[transient()],
         attempts_before=7, provider="sendgrid"),
    Case("transient, in-process retries spend the budget", Status.dead, "http_503",
         errors=[transient()], calls=3, attempts_before=5, provider="sendgrid"),
    Case("transient, the next try after expires_at", Status.expired, "http_503", errors=[transient()],
         expires_in_s=0.5, provider="sendgrid"),
    Case("transient, the next try before expires_at", Status.retrying, "http_503", errors=[transient()],
         expires_in_s=3600, wait_s=(1.0, 2.0), provider="sendgrid"),
    Case("breakers open past expires_at", Status.expired, "circuit_open", opened=[opened(60)], calls=0,
         expires_in_s=30, provider="smtp"),
    Case("delivered although expires_at is past", Status.sent, results=[SendResult("sendgrid", "m-3")],
         expires_in_s=-10, provider="sendgrid"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_conclude(case: Case) -> None:
    expires_at = NOW + timedelta(seconds=case.expires_in_s) if case.expires_in_s is not None else None
    notification = claimed(attempts=case.attempts_before, expires_at=expires_at)
    calls = Calls(
        attempts=calls_made(case.calls), results=case.results, errors=case.errors, opened=case.opened
    )
    outcome = conclude(notification=notification, calls=calls, policy=POLICY, now=NOW)
    assert outcome.notification_id == notification.id
    assert (outcome.status, outcome.error_code, outcome.provider) == (case.status, case.code, case.provider)
    assert outcome.calls == case.calls and len(outcome.attempts) == case.calls
    if case.wait_s is None:
        assert outcome.not_before is None
    else:
        assert outcome.not_before is not None
        waited = (outcome.not_before - NOW).total_seconds()
        assert case.wait_s[0] <= waited <= case.wait_s[1], waited
    if case.status is Status.dead:
        assert outcome.detail == f"gave up after {case.attempts_before + case.calls} attempts"
    if case.status is Status.sent:
        assert outcome.provider_message_id == ",".join(r.provider_message_id for r in case.results)
