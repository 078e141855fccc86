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


def shared(board: Breakers, provider: str) -> CircuitBreaker:
    breaker = board.for_provider(provider)
    assert breaker is not None
    return breaker


def test_a_tenants_breaker_lives_only_while_its_quota_refusals_do() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    board.record("p-quota", "t1", None)
    assert board.tenant_state("p-quota", "t1") is None  # a tenant never refused has none of its own
    for _ in range(SETTINGS.min_calls):
        board.check("p-quota", "t1")
        board.record("p-quota", "t1", QUOTA)
    with pytest.raises(CircuitOpen):
        board.check("p-quota", "t1")
    board.check("p-quota", "t2")  # another tenant: not refused

    clock.now_s += SETTINGS.cool_down_s
    board.check("p-quota", "t1")  # the probe
    board.record("p-quota", "t1", None)

    assert board.tenant_state("p-quota", "t1") is None  # closed again and forgotten
    assert board.snapshot() == {"p-quota": "closed"}


def test_a_tenants_probe_is_given_back_when_the_providers_breaker_refuses() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    for _ in range(SETTINGS.min_calls):
        board.record("p-both", "t1", QUOTA)  # opens t1's breaker
    clock.now_s += SETTINGS.cool_down_s - 1
    for _ in range(SETTINGS.min_calls):
        shared(board, "p-both").record(failed=True)  # and the provider's, a second later

    clock.now_s += 1  # t1's cool-down is over, not the provider's
    with pytest.raises(CircuitOpen):
        board.check("p-both", "t1")
    clock.now_s += SETTINGS.cool_down_s

    board.check("p-both", "t1")  # both half-open: t1's probe was given back, so this call is it
    board.record("p-both", "t1", None)
    assert board.tenant_state("p-both", "t1") is None and board.snapshot() == {"p-both": "closed"}


def test_a_quota_refusal_answering_the_providers_probe_does_not_wedge_its_breaker() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    for _ in range(SETTINGS.min_calls):
        shared(board, "p-wedge").record(failed=True)  # an outage opens the provider's breaker
    clock.now_s += SETTINGS.cool_down_s

    board.check("p-wedge", "t1")  # t1's push is the provider's probe; FCM answers it for t1's busy device
    board.record("p-wedge", "t1", QUOTA)

    clock.now_s += 0.1
    board.check("p-wedge", "t2")  # another tenant's push is the next probe, not refused for ever
    board.record("p-wedge", "t2", None)
    assert board.snapshot() == {"p-wedge": "closed"}


def test_a_refused_tenant_takes_no_probe_from_the_providers_breaker() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    for _ in range(SETTINGS.min_calls):
        shared(board, "p-order").record(failed=True)  # the provider's breaker opens
    clock.now_s += SETTINGS.cool_down_s - 1
    for _ in range(SETTINGS.min_calls):
        board.record("p-order", "t1", QUOTA)  # and t1's, a little before the provider's cool-down ends
    clock.now_s += 1

    with pytest.raises(CircuitOpen):
        board.check("p-order", "t1")  # t1's own breaker refuses: the provider's probe is not spent on it
    board.check("p-order", "t2")  # so another tenant's call is the provider's probe
    board.record("p-order", "t2", None)
    assert board.snapshot() == {"p-order": "closed"}


def test_a_quota_refusing_three_tenants_within_the_window_is_the_providers() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    for tenant in ("t1", "t2"):  # two tenants, each refused below its own min_calls
        board.record("p-wide", tenant, QUOTA)
    assert not board.widespread("p-wide")
    for _ in range(SETTINGS.min_calls):
        board.record("p-wide", "t1", QUOTA)  # one tenant refused again and again is its own
    assert board.snapshot() == {"p-wide": "closed"} and not board.widespread("p-wide")

    for tenant in ("t3", "t4", "t5", "t6"):  # a third tenant within the window: the provider's
        board.record("p-wide", tenant, QUOTA)

    assert board.widespread("p-wide")
    assert board.snapshot() == {"p-wide": "open"}  # every tenant stops, however little each sent
    clock.now_s += SETTINGS.window_s + 1
    assert not board.widespread("p-wide")  # the refusals have left the window


def test_a_tenant_refreshed_in_the_window_lets_an_older_one_leave_it() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    board.record("p-trim", "t1", QUOTA, to="d1")
    clock.now_s += 1
    board.record("p-trim", "t2", QUOTA, to="d2")
    clock.now_s += SETTINGS.window_s - 2
    board.record("p-trim", "t1", QUOTA, to="d3")  # t1 again, later than t2
    clock.now_s += 3  # t2's refusal has left the window, t1's second has not

    board.record("p-trim", "t3", QUOTA, to="d4")

    assert not board.widespread("p-trim")  # t1 and t3 only
    assert board.snapshot() == {"p-trim": "closed"}


def test_a_device_refused_again_in_the_window_lets_an_older_one_leave_it() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    board.record("p-devices", "t1", QUOTA, to="d-busy")
    clock.now_s += 1
    board.record("p-devices", "t2", QUOTA, to="d-once")
    clock.now_s += SETTINGS.window_s - 3
    board.record("p-devices", "t1", QUOTA, to="d-busy")  # refused again, later than d-once
    clock.now_s += 2
    board.record("p-devices", "t3", QUOTA, to="d3")
    board.record("p-devices", "t4", QUOTA, to="d4")
    clock.now_s += 1.5  # d-once's refusal has left the window, d-busy's second has not

    board.record("p-devices", "t5", QUOTA, to="d-once")  # so d-once is fresh again: t5 counts

    assert board.widespread("p-devices")  # t3, t4 and t5


def test_one_device_refused_to_three_tenants_is_that_devices_quota() -> None:
    """Tenants are internal services pushing to the same users' phones: one tenant flooding a
    phone past FCM's 240 a minute gets every tenant's push to that phone refused. Before, the third
    tenant so refused made it the provider's quota: the flooder's refusals then counted on the
    shared breaker, which opened, and each slowed every tenant's pace."""
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    for tenant in ("t-flood", "t2", "t3", "t-flood", "t-flood", "t-flood"):
        board.record("p-phone", tenant, QUOTA, to="shared-phone")

    assert not board.widespread("p-phone")
    assert board.snapshot() == {"p-phone": "closed"}
    for tenant, phone in (("t-flood", "phone-1"), ("t2", "phone-2"), ("t3", "phone-3")):
        board.record("p-phone", tenant, QUOTA, to=phone)  # three tenants refused on three phones
    assert board.widespread("p-phone")


def test_a_widespread_quota_answering_the_providers_probe_opens_it_again() -> None:
    clock = Clock()
    board = Breakers(SETTINGS, clock=clock)
    for _ in range(SETTINGS.min_calls):
        shared(board, "p-again").record(failed=True)  # the provider's breaker opens
    clock.now_s += SETTINGS.cool_down_s - 1
    board.record("p-again", "t1", QUOTA, to="d1")  # calls made before it opened, answered late
    board.record("p-again", "t2", QUOTA, to="d2")
    clock.now_s += 1

    board.check("p-again", "t3")  # the probe, refused as the two before: the project's quota
    board.record("p-again", "t3", QUOTA, to="d3")

    assert board.snapshot() == {"p-again": "open"}
    with pytest.raises(CircuitOpen):
        board.check("p-again", "t4")


def test_with_breakers_disabled_a_widespread_quota_is_still_known() -> None:
    """The pacing slows on a widespread quota (``Sender._report``) whether or not breakers are on;
    before, disabling breakers also stopped the pace from ever slowing for FCM's project quota."""
    board = Breakers(BreakerSettings(enabled=False), clock=Clock())
    board.check("p-off", "t1")
    for i, tenant in enumerate(("t1", "t2", "t3")):
        board.record("p-off", tenant, QUOTA, to=f"d{i}")

    assert board.widespread("p-off")
    assert board.snapshot() == {} and board.tenant_state("p-off", "t1") is None
