"""Adaptive provider pacing: a 429 slows a provider's pace, which recovers step by step, and the gate
admits fewer calls meanwhile without leaving the limits a rule may hold."""

from __future__ import annotations

from datetime import timedelta

from clarion.rules import RuleSpec
from core.ratelimit import MAX_PERIOD_S
from providers.errors import PermanentProviderError, TransientProviderError
from tests.fixtures.throttle_gate import NOW, admit_n, gate_for, rule_row
from workers.throttle import AdaptivePacing, _paced


def test_a_provider_429_halves_the_pace_which_then_recovers_step_by_step() -> None:
    clock = [0.0]
    pacing = AdaptivePacing(step=0.25, quiet_interval_s=5.0, cooldown_s=1.0, clock=lambda: clock[0])
    too_many = TransientProviderError("slow down", provider="twilio", code="20429", http_status=429)
    pacing.on_provider_error(too_many)
    assert pacing.factor("twilio") == 0.5
    pacing.on_provider_error(too_many)  # the same burst of rejections: counted once
    assert pacing.factor("twilio") == 0.5
    clock[0] = 1.5
    pacing.on_provider_error(too_many)
    assert pacing.factor("twilio") == 0.25
    clock[0] = 6.5
    assert pacing.factor("twilio") == 0.5
    clock[0] = 16.5
    assert pacing.factor("twilio") == 1.0
    pacing.on_provider_error(PermanentProviderError("bad", provider="twilio", code="21211", http_status=400))
    assert pacing.factor("twilio") == 1.0 and pacing.factor("sendgrid") == 1.0


async def test_a_slowed_provider_admits_fewer_calls() -> None:
    clock = [0.0]
    pacing = AdaptivePacing(clock=lambda: clock[0])
    pacing.on_provider_error(TransientProviderError("x", provider="apns", code="429", http_status=429))
    gate = gate_for(rule_row(scope="provider", limit=2, period_s=1.0, action="delay"), pacing=pacing)
    outcomes = await admit_n(gate, 3)
    assert outcomes[0] is None and outcomes[1] is None  # the burst is unchanged...
    # ...but the next slot is twice as far: rate 2/s halved to 1/s
    assert outcomes[2].not_before == NOW + timedelta(seconds=1)


def test_a_pacing_factor_that_would_leave_the_limits_keeps_the_nominal_pace() -> None:
    longest = RuleSpec(**rule_row(scope="provider", provider="sandbox", limit=1, period_s=MAX_PERIOD_S))
    assert _paced(longest, 1 / 16) == longest.to_rule()
    minute = RuleSpec(**rule_row(scope="provider", provider="sandbox", limit=1, period_s=60.0))
    assert _paced(minute, 1 / 16).period_s == 960.0
