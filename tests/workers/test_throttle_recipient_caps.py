"""Recipient caps at the throttle gate: drop or delay past the cap, per user and category, per tenant,
bypassed by critical sends, untouched by pacing holds, and picked up when the rules change."""

from __future__ import annotations

import uuid
from datetime import timedelta

from clarion.rules import RulesCache
from core.horizon import MAX_WAIT
from core.ratelimit_memory import MemoryRateLimiter
from tests.fixtures.throttle_gate import DEVICE, HELLO, NOW, Table, admit_n, gate_for, notification, rule_row
from workers.throttle import ThrottleGate


async def test_recipient_cap_with_drop_throttles_the_third_naming_the_rule() -> None:
    gate = gate_for(rule_row(name="2-push-per-minute", channel="push"))
    first, second, third = await admit_n(gate, 3)
    assert first is None and second is None
    assert third.status == "throttled" and third.error_code == "rate_limited"
    assert third.detail == "rule 2-push-per-minute"


async def test_recipient_cap_with_delay_holds_the_third_until_the_window_has_passed() -> None:
    gate = gate_for(rule_row(action="delay"))
    outcomes = await admit_n(gate, 4)
    assert outcomes[:2] == [None, None]
    third, fourth = outcomes[2:]
    assert third.status == "delayed" and third.error_code == "rate_limited"
    assert third.not_before == NOW + timedelta(seconds=60)
    # a backlog is spread one slot apart instead of republished all at once
    assert fourth.not_before == NOW + timedelta(seconds=120)


async def test_recipient_caps_are_per_user_and_per_category_when_the_rule_names_one() -> None:
    gate = gate_for(rule_row(limit=1, category="news"))
    assert await gate.admit(notification(), HELLO, DEVICE) is None
    assert await gate.admit(notification(user_id=uuid.UUID(int=2)), HELLO, DEVICE) is None
    assert await gate.admit(notification(category="security"), HELLO, DEVICE) is None
    assert (await gate.admit(notification(), HELLO, DEVICE)).status == "throttled"


async def test_another_tenants_rule_does_not_apply() -> None:
    gate = gate_for(rule_row(limit=1, tenant_id="t2"))
    assert await admit_n(gate, 3) == [None, None, None]


async def test_critical_bypasses_recipient_caps_but_not_provider_pacing() -> None:
    cap = rule_row(limit=1)
    pace = rule_row(scope="provider", provider="apns", limit=2, period_s=1.0, action="delay")
    gate = gate_for(cap, pace)
    assert await admit_n(gate, 2, priority="critical") == [None, None]
    held = await gate.admit(notification(priority="critical"), HELLO, DEVICE)
    assert held.status == "delayed" and held.detail == "rule rule"


async def test_a_notification_held_by_pacing_does_not_use_up_its_recipients_cap() -> None:
    pace = rule_row(scope="provider", limit=1, period_s=60.0, action="delay")
    table = Table([pace, rule_row(limit=1, period_s=60.0)])
    gate = ThrottleGate(
        rules=RulesCache(table.fetch, ttl_s=0.0),
        limiter=MemoryRateLimiter(),
        provider_name=lambda _: "apns",
        clock=lambda: NOW,
    )
    assert await gate.admit(notification(), HELLO, DEVICE) is None
    user2 = uuid.UUID(int=2)
    assert (await gate.admit(notification(user_id=user2), HELLO, DEVICE)).status == "delayed"
    table.rules.remove(pace)
    assert await gate.admit(notification(user_id=user2), HELLO, DEVICE) is None
    assert (await gate.admit(notification(user_id=user2), HELLO, DEVICE)).status == "throttled"


async def test_changed_rules_are_picked_up_after_the_refresh_interval() -> None:
    table = Table([])
    now_s = [0.0]
    cache = RulesCache(table.fetch, ttl_s=2.0, clock=lambda: now_s[0])
    gate = ThrottleGate(
        rules=cache, limiter=MemoryRateLimiter(), provider_name=lambda _: "apns", clock=lambda: NOW
    )
    assert await admit_n(gate, 2) == [None, None]
    table.rules.append(rule_row(limit=1))
    now_s[0] = 1.9
    assert await admit_n(gate, 2) == [None, None]  # within the interval: the cached rules still hold
    now_s[0] = 2.0
    first, second = await admit_n(gate, 2)
    assert first is None and second.status == "throttled"
    table.rules.clear()
    now_s[0] = 4.0
    assert await admit_n(gate, 2) == [None, None]


async def test_a_backlog_held_past_the_horizon_is_throttled_not_delayed_for_years() -> None:
    """A cap of one per 31 days with ``delay`` spreads a backlog a slot apart; each held send keeps
    its day of the log, so a hold past ``MAX_WAIT`` ends the notification instead."""
    month = 31 * 24 * 3600.0
    gate = gate_for(rule_row(name="monthly", limit=1, period_s=month, action="delay"))
    first, second, third = await admit_n(gate, 3)
    assert first is None
    assert second.status == "throttled" and second.detail == "rule monthly"  # 31 days > MAX_WAIT
    assert "past 30 days" in second.error_message and third.status == "throttled"

    weekly = gate_for(rule_row(limit=1, period_s=7 * 24 * 3600.0, action="delay"))
    held = await admit_n(weekly, 6)
    assert [o.status for o in held[1:]] == ["delayed"] * 4 + ["throttled"]  # 28 days held, then 35
    assert held[4].not_before == NOW + timedelta(days=28) <= NOW + MAX_WAIT


async def test_a_notification_throttled_past_the_horizon_reserves_no_slot_for_the_next() -> None:
    """Ten days on, a send behind a held one waits for its slot after it, not after the one that
    was never held."""
    elapsed = [0.0]
    table = Table([rule_row(limit=1, period_s=20 * 24 * 3600.0, action="delay")])
    gate = ThrottleGate(
        rules=RulesCache(table.fetch),
        limiter=MemoryRateLimiter(clock=lambda: 1_000.0 + elapsed[0]),
        provider_name=lambda platform: platform or "twilio",
        clock=lambda: NOW + timedelta(seconds=elapsed[0]),
    )
    first, held, past = await admit_n(gate, 3)
    assert first is None and held.not_before == NOW + timedelta(days=20)
    assert past.status == "throttled"  # its slot would be day 40: past MAX_WAIT
    elapsed[0] = 10 * 24 * 3600.0
    [later] = await admit_n(gate, 1)
    assert later.status == "delayed" and later.not_before == NOW + timedelta(days=40)  # 30 days on
