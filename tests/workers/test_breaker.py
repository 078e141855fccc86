"""The circuit breaker: opens on a failure rate, refuses calls, lets one probe through, closes."""

from __future__ import annotations

import pytest

from clarion import metrics
from clarion.retry_settings import BreakerSettings
from providers.errors import QuotaExceeded
from workers.breaker import Breakers, CircuitBreaker, CircuitOpen, breaker_states


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


SETTINGS = BreakerSettings(failure_rate=0.5, window_s=10, min_calls=4, cool_down_s=5)


def opened(provider: str, clock: Clock) -> CircuitBreaker:
    """A breaker for ``provider`` that ``min_calls`` failures have just opened."""
    breaker = CircuitBreaker(provider, SETTINGS, clock=clock)
    for _ in range(SETTINGS.min_calls):
        breaker.record(failed=True)
    assert breaker.state == "open"
    return breaker


def gauge(provider: str) -> float:
    return float(metrics.BREAKER_STATE.labels(provider)._value.get())


def test_breaker_opens_when_failure_rate_reaches_threshold_and_refuses_calls() -> None:
    clock = Clock()
    breaker = CircuitBreaker("p-open", SETTINGS, clock=clock)
    for failed in (False, True, False):
        breaker.check()
        breaker.record(failed=failed)
    assert breaker.state == "closed", "3 calls are below min_calls"
    breaker.check()
    breaker.record(failed=True)  # 2 of 4 failed: 50%
    assert breaker.state == "open"
    assert gauge("p-open") == 2
    with pytest.raises(CircuitOpen) as refused:
        breaker.check()
    assert refused.value.provider == "p-open"


def test_failures_outside_the_window_are_forgotten() -> None:
    clock = Clock()
    breaker = CircuitBreaker("p-window", SETTINGS, clock=clock)
    for _ in range(3):
        breaker.record(failed=True)
    clock.now_s += 11
    breaker.record(failed=True)
    assert breaker.state == "closed"


def test_permanent_errors_do_not_count_as_failures() -> None:
    breaker = CircuitBreaker("p-permanent", SETTINGS, clock=Clock())
    for _ in range(10):
        breaker.record(failed=False)  # what the pipeline records for a permanent error
    assert breaker.state == "closed"


def test_after_cool_down_one_probe_passes_and_its_success_closes() -> None:
    clock = Clock()
    breaker = opened("p-probe", clock)
    clock.now_s += 5
    assert breaker.state == "half_open"
    assert gauge("p-probe") == 1
    breaker.check()  # the probe
    with pytest.raises(CircuitOpen):
        breaker.check()  # everyone else waits for the probe
    breaker.record(failed=False)
    assert breaker.state == "closed"
    assert gauge("p-probe") == 0
    breaker.check()


def test_a_failed_probe_opens_again_for_a_full_cool_down() -> None:
    clock = Clock()
    breaker = opened("p-reopen", clock)
    clock.now_s += 5
    breaker.check()
    breaker.record(failed=True)
    assert breaker.state == "open"
    clock.now_s += 4
    assert breaker.state == "open"
    clock.now_s += 1
    assert breaker.state == "half_open"


def test_breaker_states_report_every_provider_of_the_process() -> None:
    board = Breakers(SETTINGS)
    failing = board.for_provider("p-states-a")
    assert failing is not None and board.for_provider("p-states-a") is failing
    for _ in range(4):
        failing.record(failed=True)
    board.for_provider("p-states-b")
    states = breaker_states()
    assert states["p-states-a"] == "open" and states["p-states-b"] == "closed"
    assert Breakers(BreakerSettings(enabled=False)).for_provider("x") is None


QUOTA = QuotaExceeded("429 QUOTA_EXCEEDED", provider="p-quota", code="QUOTA_EXCEEDED", http_status=429)


def test_a_tenants_breaker_lives_only_while_its_quota_refusals_do() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    guard = board.guard("p-quota", "t1")
    assert guard is not None
    guard.record(None)
    assert board._by_tenant == {}  # a tenant never refused has no breaker of its own
    for _ in range(SETTINGS.min_calls):
        guard.check()
        guard.record(QUOTA)
    with pytest.raises(CircuitOpen):
        guard.check()
    board.guard("p-quota", "t2").check()  # type: ignore[union-attr]  # another tenant: not refused

    clock.now_s += SETTINGS.cool_down_s
    guard.check()  # the probe
    guard.record(None)

    assert board._by_tenant == {}  # closed again and forgotten: one entry per tenant refused lately
    assert board.snapshot() == {"p-quota": "closed"}


def test_a_tenants_probe_is_given_back_when_the_providers_breaker_refuses() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    guard = board.guard("p-both", "t1")
    assert guard is not None
    for _ in range(SETTINGS.min_calls):
        guard.record(QUOTA)  # opens t1's breaker
    clock.now_s += SETTINGS.cool_down_s - 1
    for _ in range(SETTINGS.min_calls):
        guard.shared.record(failed=True)  # and the provider's, a second later

    clock.now_s += 1  # t1's cool-down is over, not the provider's
    with pytest.raises(CircuitOpen):
        guard.check()
    clock.now_s += SETTINGS.cool_down_s

    guard.check()  # both half-open: t1's probe was given back, so this call is it
    guard.record(None)
    assert board._by_tenant == {} and guard.shared.state == "closed"


def test_a_quota_refusal_answering_the_providers_probe_does_not_wedge_its_breaker() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    flooder, other = board.guard("p-wedge", "t1"), board.guard("p-wedge", "t2")
    assert flooder is not None and other is not None
    for _ in range(SETTINGS.min_calls):
        flooder.shared.record(failed=True)  # an outage opens the provider's breaker
    clock.now_s += SETTINGS.cool_down_s

    flooder.check()  # t1's push is the provider's probe; FCM answers it for t1's busy device
    flooder.record(QUOTA)

    clock.now_s += 0.1
    other.check()  # another tenant's push is the next probe, not refused for ever
    other.record(None)
    assert board.snapshot() == {"p-wedge": "closed"}


def test_a_refused_tenant_takes_no_probe_from_the_providers_breaker() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    flooder, other = board.guard("p-order", "t1"), board.guard("p-order", "t2")
    assert flooder is not None and other is not None
    for _ in range(SETTINGS.min_calls):
        flooder.shared.record(failed=True)  # the provider's breaker opens
    clock.now_s += SETTINGS.cool_down_s - 1
    for _ in range(SETTINGS.min_calls):
        flooder.record(QUOTA)  # and t1's, a little before the provider's cool-down ends
    clock.now_s += 1

    with pytest.raises(CircuitOpen):
        flooder.check()  # t1's own breaker refuses: the provider's probe is not spent on it
    other.check()  # so another tenant's call is the provider's probe
    other.record(None)
    assert board.snapshot() == {"p-order": "closed"}
