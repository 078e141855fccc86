"""The throttle gate on the in-process limiter: recipient caps, provider pacing, costs, priority."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from clarion.rules import RulesCache
from providers.errors import PermanentProviderError, TransientProviderError
from workers.ratelimit import MemoryRateLimiter
from workers.recipients import Address
from workers.render import RenderedContent
from workers.throttle import AdaptivePacing, ThrottleGate, sms_segments

NOW = datetime(2030, 1, 1, tzinfo=UTC)
HELLO = RenderedContent(subject=None, body="hello", html=None)


def rule_row(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": uuid.uuid4(),
        "tenant_id": "t1",
        "name": "rule",
        "scope": "recipient",
        "channel": None,
        "category": None,
        "provider": None,
        "limit": 2,
        "period_s": 60.0,
        "burst": 0,
        "mode": "hard",
        "overshoot_pct": 0.0,
        "action": "drop",
    }
    row.update(overrides)
    return row


class Table:
    """Rows a `RulesCache` reads, editable by the test (stands in for the two tables)."""

    def __init__(self, rules: list[dict[str, Any]]) -> None:
        self.rules = rules
        self.windows: list[dict[str, Any]] = []

    async def fetch(self, sql: str) -> Sequence[Mapping[str, Any]]:
        return self.rules if "rate_limit_rules" in sql else self.windows


def gate_for(*rules: dict[str, Any], pacing: AdaptivePacing | None = None) -> ThrottleGate:
    return ThrottleGate(
        rules=RulesCache(Table(list(rules)).fetch),
        limiter=MemoryRateLimiter(),
        provider_name=lambda platform: platform or "twilio",
        pacing=pacing,
        clock=lambda: NOW,
    )


def notification(**overrides: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "id": uuid.uuid4(),
        "tenant_id": "t1",
        "user_id": uuid.UUID(int=1),
        "channel": "push",
        "category": "news",
        "priority": "normal",
    }
    row.update(overrides)
    return row


PHONE = [Address("+14155550100")]
DEVICE = [Address("tok-1", "apns")]


async def admit_n(
    gate: ThrottleGate, n: int, addresses: list[Address] = DEVICE, **overrides: Any
) -> list[Any]:
    return [await gate.admit(notification(**overrides), HELLO, addresses) for _ in range(n)]


@pytest.mark.parametrize(
    ("body", "segments"),
    [
        ("a" * 160, 1),
        ("a" * 161, 2),
        ("a" * 306, 2),
        ("a" * 307, 3),
        ("€" * 80, 1),  # GSM-7 extension characters count twice
        ("€" * 81, 2),
        ("é" * 160, 1),  # in the GSM-7 basic set
        ("ł" * 70, 1),  # not GSM-7: UCS-2
        ("ł" * 71, 2),
        ("😀" * 35, 1),  # two UTF-16 units each
        ("😀" * 36, 2),
    ],
)
def test_sms_segments_follow_the_gsm7_and_ucs2_rules(body: str, segments: int) -> None:
    assert sms_segments(body) == segments


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


async def test_a_multi_segment_sms_costs_its_segments_at_the_provider() -> None:
    gate = gate_for(rule_row(scope="provider", limit=3, period_s=1.0, action="delay"))
    three_segments = RenderedContent(subject=None, body="x" * 400, html=None)
    assert await gate.admit(notification(channel="sms"), three_segments, PHONE) is None
    held = await gate.admit(notification(channel="sms"), HELLO, PHONE)
    assert held.status == "delayed"


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


async def test_changed_rules_are_picked_up_after_the_refresh_interval() -> None:
    table = Table([])
    cache = RulesCache(table.fetch, ttl_s=0.05)
    gate = ThrottleGate(
        rules=cache, limiter=MemoryRateLimiter(), provider_name=lambda _: "apns", clock=lambda: NOW
    )
    assert await admit_n(gate, 2) == [None, None]
    table.rules.append(rule_row(limit=1))
    await asyncio.sleep(0.06)
    first, second = await admit_n(gate, 2)
    assert first is None and second.status == "throttled"
    table.rules.clear()
    await asyncio.sleep(0.06)
    assert await admit_n(gate, 2) == [None, None]
