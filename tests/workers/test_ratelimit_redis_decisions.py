"""The Redis limiter decides as the memory backend does (GCRA), on Redis's clock, and keeps no idle
keys and no stale script."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from core.limiter import build_rate_limiter
from core.ratelimit import Allowed, RetryAfter, Rule
from core.ratelimit_lua import CHUNK
from core.ratelimit_memory import MemoryRateLimiter
from core.ratelimit_redis import RedisRateLimiter
from harness.services import wait_until
from tests.fixtures.ratelimit import HOURLY, TIMELINES, assert_close
from tests.fixtures.redis_limiter import REDIS_URL, limiter_fixture, prefix_fixture, redis_fixture  # noqa: F401 - fixtures


@pytest.mark.parametrize("timeline", TIMELINES)
async def test_redis_decisions_match_the_memory_timeline(limiter: RedisRateLimiter, timeline: str) -> None:
    memory = MemoryRateLimiter(clock=lambda: 1000.0)
    expected = [await memory.acquire(key, rule, cost) for key, rule, cost in TIMELINES[timeline]]

    actual = [await limiter.acquire(key, rule, cost) for key, rule, cost in TIMELINES[timeline]]

    assert_close(actual, expected)


async def test_redis_burst_timeline_is_exact(limiter: RedisRateLimiter) -> None:
    decisions = [await limiter.acquire("k", HOURLY) for _ in range(11)]

    assert_close(decisions[:10], [Allowed(9 - i, 360_000 * (i + 1)) for i in range(10)])
    assert_close([decisions[10]], [RetryAfter(retry_after_ms=360_000, reset_after_ms=3_600_000)])


async def test_a_long_burst_with_a_fractional_interval_admits_exactly_capacity(
    limiter: RedisRateLimiter,
) -> None:
    rule = Rule("big", limit=30_000, period_s=36_001.0)  # T = 1200.033 ms, far longer than the batch

    decisions = await limiter.acquire_many([("k", rule, 1)] * 30_001)

    assert sum(map(bool, decisions)) == 30_000
    assert not decisions[-1]


async def test_retrying_after_retry_after_ms_is_admitted(limiter: RedisRateLimiter) -> None:
    rule = Rule("fast", limit=5, period_s=0.5)  # T = 100 ms
    for _ in range(5):
        assert await limiter.acquire("k", rule)
    rejected = await limiter.acquire("k", rule)
    assert isinstance(rejected, RetryAfter)
    assert 50 <= rejected.retry_after_ms <= 100

    # waiting out retry_after_ms is what is tested, on Redis's own clock (TIME): none to inject
    await asyncio.sleep(rejected.retry_after_ms / 1000)

    assert await limiter.acquire("k", rule)


async def test_idle_keys_expire_when_their_bucket_is_full(
    limiter: RedisRateLimiter, redis: Redis, prefix: str
) -> None:
    rule = Rule("short", limit=10, period_s=0.5)  # T = 50 ms
    await limiter.acquire("k", rule, cost=2)
    await limiter.acquire("s", Rule("soft", limit=10, period_s=0.5, mode="soft", overshoot_pct=10))

    assert 0 < await redis.pttl(prefix + "k") <= 100
    assert 0 < await redis.pttl(prefix + "s|nominal") <= 50

    async def expired() -> bool:
        return await redis.exists(prefix + "k", prefix + "s", prefix + "s|nominal") == 0

    await wait_until(expired, timeout_s=1.0, interval_s=0.02)  # Redis expires them, on its clock


async def test_reloads_the_script_after_noscript(limiter: RedisRateLimiter) -> None:
    assert await limiter.acquire("k", HOURLY)
    limiter._sha = "0" * 40  # as after a Redis restart or SCRIPT FLUSH
    assert_close([await limiter.acquire("k", HOURLY)], [Allowed(remaining=8, reset_after_ms=720_000)])
    limiter._sha = "0" * 40

    decisions = await limiter.acquire_many([("k", HOURLY, 1)] * 9)

    assert [bool(d) for d in decisions] == [True] * 8 + [False]
    limiter._sha = "0" * 40
    many = await limiter.acquire_many([(f"m{i}", HOURLY, 1) for i in range(CHUNK * 2 + 1)])  # pipelined
    assert all(isinstance(d, Allowed) and d.remaining == 9 for d in many)


async def test_build_with_url_is_redis(prefix: str) -> None:
    limiter = build_rate_limiter(REDIS_URL, prefix=prefix)
    assert isinstance(limiter, RedisRateLimiter)
    assert_close([await limiter.acquire("k", HOURLY)], [Allowed(remaining=9, reset_after_ms=360_000)])
    await limiter.aclose()


async def test_a_debt_of_1e17_ms_is_stored_as_an_integer_expiry(limiter: RedisRateLimiter) -> None:
    """A month's rule of limit 1 and a burst of 10^7, paced 16x slower (adaptive provider pacing),
    charged 2.4 M: the key's expiry is 1e17 ms, which Redis refused as "1e+17" (a hostile probe)."""
    worst = Rule("w", limit=1, period_s=2_678_400 * 16, burst=10_000_000)
    expected = await MemoryRateLimiter(clock=lambda: 1000.0).acquire_many(
        [("k", worst, 2_400_000), ("k", worst, 0)]
    )
    assert_close(await limiter.acquire_many([("k", worst, 2_400_000), ("k", worst, 0)]), expected)
