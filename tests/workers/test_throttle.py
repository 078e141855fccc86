"""The throttle gate: recipient caps, provider pacing, costs, priority, elastic caps.

Most tests run on the in-process limiter; the elastic caps run on it and on the real Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from redis.asyncio import Redis

from clarion.rules import RulesCache, RuleSpec
from core.ratelimit import MAX_PERIOD_S, MAX_REFILL_S, Allowed, InvalidRule, RateLimiter, Rule
from core.ratelimit_memory import MemoryRateLimiter
from core.ratelimit_redis import RedisRateLimiter
from core.render import RenderedContent
from providers.errors import PermanentProviderError, TransientProviderError
from tests.fixtures.claimed import claimed
from workers.claim import ClaimedNotification
from workers.recipients import Address
from workers.throttle import AdaptivePacing, ThrottleGate, _paced, sms_segments

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


def gate_for(
    *rules: dict[str, Any], pacing: AdaptivePacing | None = None, limiter: RateLimiter | None = None
) -> ThrottleGate:
    return ThrottleGate(
        rules=RulesCache(Table(list(rules)).fetch),
        # The limiter's clock stands still with the gate's: a loaded machine cannot move a retry-after.
        limiter=limiter or MemoryRateLimiter(clock=lambda: 1_000.0),
        provider_name=lambda platform: platform or "twilio",
        pacing=pacing,
        clock=lambda: NOW,
    )


def notification(**overrides: Any) -> ClaimedNotification:
    defaults: dict[str, Any] = {"user_id": uuid.UUID(int=1), "channel": "push", "category": "news"}
    return claimed(**{**defaults, **overrides})


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


@pytest.mark.parametrize(
    ("body", "segments"),
    [
        ("Code: \ud800", 1),  # the poisoned SMS: a lone surrogate is one UTF-16 unit
        ("\udfff" * 70, 1),
        ("\udc80" * 71, 2),
        ("a\ud83d" + "😀" * 34, 1),  # 1 + 1 + 68 units
        ("a\ud83d" + "😀" * 35, 2),
    ],
)
def test_sms_segments_counts_text_no_codec_can_encode_instead_of_raising(body: str, segments: int) -> None:
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


REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    if request.param == "memory":
        yield MemoryRateLimiter()
        return
    prefix = f"clarion-test:{uuid.uuid4()}:"
    limiter = RedisRateLimiter.from_url(REDIS_URL, prefix=prefix, registry=CollectorRegistry())
    yield limiter
    await limiter.aclose()
    redis = Redis.from_url(REDIS_URL)
    keys = [key async for key in redis.scan_iter(match=prefix + "*")]
    if keys:
        await redis.delete(*keys)
    await redis.aclose()


def hourly_pacing(limit: int, **overrides: Any) -> dict[str, Any]:
    """Pacing that does not refill during a test: what it lends is what is left of ``limit``."""
    fields = {"scope": "provider", "provider": "apns", "limit": limit, "period_s": 3600.0, "action": "delay"}
    return rule_row(**(fields | overrides))


def borrowed_count(rule: str) -> float:
    return (
        REGISTRY.get_sample_value("clarion_ratelimit_decisions_total", {"rule": rule, "decision": "borrowed"})
        or 0.0
    )


@pytest.mark.parametrize(("mode", "sent_to_a"), [("hard", 2), ("elastic", 3)])
async def test_an_elastic_cap_sends_above_its_limit_while_the_provider_has_spare_capacity(
    limiter: RateLimiter, mode: str, sent_to_a: int
) -> None:
    cap = rule_row(name=f"2-push-per-hour-{mode}", channel="push", limit=2, period_s=3600.0, mode=mode)
    gate = gate_for(cap, hourly_pacing(6), limiter=limiter)
    borrowed_before = borrowed_count(f"tenant:{cap['scope']}")
    user_a, user_b = uuid.UUID(int=1), uuid.UUID(int=2)

    to_a = await admit_n(gate, 3, user_id=user_a)  # pacing: 3 of 6 used, room for more
    to_b = await admit_n(gate, 2, user_id=user_b)  # 5 of 6: room for one more call

    assert [o is None for o in to_a] == [True] * sent_to_a + [False] * (3 - sent_to_a)
    assert to_b == [None, None]
    assert borrowed_count(f"tenant:{cap['scope']}") - borrowed_before == sent_to_a - 2
    # this call takes the provider's last slot: nothing left to spare, so the cap holds
    held = await gate.admit(notification(user_id=user_a), HELLO, DEVICE)
    assert held.status == "throttled" and held.detail == f"rule {cap['name']}"


async def test_an_elastic_cap_borrows_from_the_pacing_rule_with_the_least_room(limiter: RateLimiter) -> None:
    cap = rule_row(name="elastic-cap", channel="push", limit=1, period_s=3600.0, mode="elastic")
    roomy, tight = hourly_pacing(100, name="roomy"), hourly_pacing(3, name="tight", tenant_id=None)
    gate = gate_for(cap, roomy, tight, limiter=limiter)

    outcomes = await admit_n(gate, 3)

    # the 2nd borrows (tight: 2 of 3 used); the 3rd takes tight's last slot though roomy has 97
    assert outcomes[:2] == [None, None]
    assert outcomes[2].status == "throttled" and outcomes[2].detail == "rule elastic-cap"


async def test_an_elastic_cap_with_no_pacing_for_its_notification_holds_at_its_limit(
    limiter: RateLimiter,
) -> None:
    cap = rule_row(name="elastic-cap", channel="push", limit=2, period_s=3600.0, mode="elastic")
    gate = gate_for(cap, hourly_pacing(100, provider="fcm"), limiter=limiter)  # paces Android only

    outcomes = await admit_n(gate, 3)  # to an iOS device

    assert outcomes[:2] == [None, None]
    assert outcomes[2].status == "throttled"


async def test_an_elastic_cap_over_its_limit_with_delay_waits_for_its_own_window(
    limiter: RateLimiter,
) -> None:
    cap = rule_row(channel="push", limit=1, period_s=60.0, mode="elastic", action="delay")
    gate = gate_for(cap, hourly_pacing(2), limiter=limiter)

    first, second = await admit_n(gate, 2)

    assert first is None
    assert second.status == "delayed"  # not before its own window has passed (Redis time moves a little)
    assert NOW + timedelta(seconds=59) <= second.not_before <= NOW + timedelta(seconds=60)


@pytest.mark.parametrize(
    ("limit", "period_s", "extra"),
    [
        (10_000_000, 5e-324, {}),  # the rule: ZeroDivisionError in memory, -2**63 in Redis
        (10, 0.0, {}),
        (10, float("nan"), {}),
        (10, float("inf"), {}),
        (10**7, 1.0, {}),  # ten events per microsecond
        (1, 1e300, {}),  # Redis: "value is not an integer or out of range"
        (1, MAX_PERIOD_S * 1.01, {}),
        (1, 1000.0, {"burst": 2**53}),  # a full bucket would take 2**53 * 1000 s to refill
        (2**63, 10.0**13, {}),
        (0, 1.0, {}),
        (10, 1.0, {"burst": -1}),
        (10, 1.0, {"mode": "soft", "overshoot_pct": 1e300}),
        (10, 1.0, {"mode": "soft", "overshoot_pct": float("nan")}),
    ],
)
def test_a_rule_no_limiter_can_enforce_is_refused_by_the_limiter(
    limit: int, period_s: float, extra: dict[str, Any]
) -> None:
    with pytest.raises(InvalidRule):
        Rule("r", limit, period_s, **extra)


# The largest figures a rule may hold: both limiters answer in range (int64 in the Lua script).
EXTREME_RULES = [
    Rule("refill", 1, MAX_PERIOD_S, burst=int(MAX_REFILL_S / MAX_PERIOD_S) - 1),
    Rule("fine", 10**6, 1.0, burst=2**53 // 10**6),
    Rule("soft", 10, MAX_PERIOD_S, mode="soft", overshoot_pct=1000),
]


@pytest.mark.parametrize("rule", EXTREME_RULES, ids=lambda r: r.rule_id)
async def test_the_most_extreme_valid_rules_get_in_range_answers_from_both_limiters(rule: Rule) -> None:
    redis = Redis.from_url("redis://127.0.0.1:6379/0")
    prefix = f"clarion-test:{uuid.uuid4()}:"
    backends: list[RateLimiter] = [
        MemoryRateLimiter(),
        RedisRateLimiter(redis, prefix=prefix, registry=CollectorRegistry()),
    ]
    try:
        for limiter in backends:
            first, second = [await limiter.acquire("k", rule) for _ in range(2)]
            for d in (first, second):
                assert isinstance(d, Allowed), (limiter, d)
                assert 0 <= d.remaining <= 2**63 - 1 and 0 <= d.reset_after_ms <= MAX_REFILL_S * 1000
            assert second.remaining <= first.remaining
    finally:
        await redis.delete(*[key async for key in redis.scan_iter(match=prefix + "*")] or ["-"])
        await redis.aclose()


def test_a_pacing_factor_that_would_leave_the_limits_keeps_the_nominal_pace() -> None:
    longest = RuleSpec(**rule_row(scope="provider", provider="sandbox", limit=1, period_s=MAX_PERIOD_S))
    assert _paced(longest, 1 / 16) == longest.to_rule()
    minute = RuleSpec(**rule_row(scope="provider", provider="sandbox", limit=1, period_s=60.0))
    assert _paced(minute, 1 / 16).period_s == 960.0


async def test_a_stored_rule_no_limiter_can_enforce_is_skipped_and_the_others_still_apply() -> None:
    bad = rule_row(scope="provider", provider="sandbox", limit=10_000_000, period_s=5e-324)
    # Valid as stored, not as the limiter gets it: a cap of 2**40 per period is one per period
    # with a burst of 2**40 - 1, which would take 2**40 periods to refill.
    bad_cap = rule_row(limit=2**40, period_s=3600.0)
    good = rule_row(name="good")
    snapshot = await RulesCache(Table([bad, bad_cap, good]).fetch).current()
    assert [r.id for r in snapshot.rules] == [good["id"]]
    assert REGISTRY.get_sample_value("clarion_rate_limit_rules_skipped") == 2
