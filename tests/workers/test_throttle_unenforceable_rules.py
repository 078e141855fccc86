"""Rules at the edge of what a limiter can enforce: refused by the limiter, skipped when stored (the
others still apply), and the most extreme valid ones answered in range by both limiters."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from redis.asyncio import Redis

from clarion.rules import RulesCache
from core.ratelimit import MAX_PERIOD_S, MAX_REFILL_S, Allowed, InvalidRule, RateLimiter, Rule
from core.ratelimit_memory import MemoryRateLimiter
from core.ratelimit_redis import RedisRateLimiter
from tests.fixtures.redis_limiter import fresh_prefix
from tests.fixtures.throttle_gate import Table, rule_row


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
    prefix = fresh_prefix()
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


async def test_a_stored_rule_no_limiter_can_enforce_is_skipped_and_the_others_still_apply() -> None:
    bad = rule_row(scope="provider", provider="sandbox", limit=10_000_000, period_s=5e-324)
    # Valid as stored, not as the limiter gets it: a cap of 2**40 per period is one per period
    # with a burst of 2**40 - 1, which would take 2**40 periods to refill.
    bad_cap = rule_row(limit=2**40, period_s=3600.0)
    good = rule_row(name="good")
    snapshot = await RulesCache(Table([bad, bad_cap, good]).fetch).current()
    assert [r.id for r in snapshot.rules] == [good["id"]]
    assert REGISTRY.get_sample_value("clarion_rate_limit_rules_skipped") == 2
