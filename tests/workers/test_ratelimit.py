"""GCRA semantics on the in-process limiter, against hand-computed timelines (injected clock)."""

from __future__ import annotations

import pytest

from core.limiter import build_rate_limiter
from core.ratelimit import Allowed, ElasticPool, RetryAfter, Rule, rate_limit_headers
from core.ratelimit_memory import MemoryRateLimiter
from tests.fixtures.ratelimit import HOURLY

TEN_PER_S = Rule("ten-per-s", limit=10, period_s=1.0)  # emission interval T = 100 ms


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def limiter(clock: FakeClock) -> MemoryRateLimiter:
    return MemoryRateLimiter(clock=clock)


async def test_idle_key_admits_limit_at_once_then_retry_after_one_interval(
    limiter: MemoryRateLimiter,
) -> None:
    decisions = [await limiter.acquire("k", TEN_PER_S) for _ in range(11)]

    assert decisions[:10] == [Allowed(remaining=9 - i, reset_after_ms=100 * (i + 1)) for i in range(10)]
    assert decisions[10] == RetryAfter(retry_after_ms=100, reset_after_ms=1000, remaining=0)


async def test_burst_adds_to_capacity(limiter: MemoryRateLimiter) -> None:
    rule = Rule("burst", limit=10, period_s=1.0, burst=5)

    decisions = [await limiter.acquire("k", rule) for _ in range(16)]

    assert all(decisions[:15])
    assert decisions[14] == Allowed(remaining=0, reset_after_ms=1500)
    assert decisions[15] == RetryAfter(retry_after_ms=100, reset_after_ms=1500)


async def test_request_at_window_edge_is_allowed_but_not_one_ms_before(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    for _ in range(10):
        await limiter.acquire("k", TEN_PER_S)

    clock.now_s = 0.099
    assert await limiter.acquire("k", TEN_PER_S) == RetryAfter(retry_after_ms=1, reset_after_ms=901)
    clock.now_s = 0.100
    assert await limiter.acquire("k", TEN_PER_S) == Allowed(remaining=0, reset_after_ms=1000)
    assert await limiter.acquire("k", TEN_PER_S) == RetryAfter(retry_after_ms=100, reset_after_ms=1000)


async def test_steady_rate_after_burst_admits_one_per_interval(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    admitted_at_t0 = sum([bool(await limiter.acquire("k", TEN_PER_S)) for _ in range(20)])
    admitted_ticks = []
    for tick in range(1, 501):  # one attempt every 10 ms for 5 s: 10x the limit
        clock.now_s = tick / 100
        if await limiter.acquire("k", TEN_PER_S):
            admitted_ticks.append(tick)

    assert admitted_at_t0 == 10
    assert admitted_ticks == list(range(10, 501, 10))
    # admitted = limit * elapsed / period + capacity
    assert admitted_at_t0 + len(admitted_ticks) == 10 * 5.0 / 1.0 + 10


async def test_a_long_burst_with_a_fractional_interval_admits_exactly_capacity(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    clock.now_s = 86_400.0 * 30  # a month of uptime: TATs must stay precise far from zero
    rule = Rule("big", limit=30_000, period_s=36_001.0)

    decisions = await limiter.acquire_many([("k", rule, 1)] * 30_001)

    assert sum(map(bool, decisions)) == 30_000
    assert not decisions[-1]


async def test_cost_consumes_cost_intervals(limiter: MemoryRateLimiter, clock: FakeClock) -> None:
    assert await limiter.acquire("k", TEN_PER_S, cost=4) == Allowed(remaining=6, reset_after_ms=400)
    assert await limiter.acquire("k", TEN_PER_S, cost=7) == RetryAfter(
        retry_after_ms=100, reset_after_ms=400, remaining=6
    )
    clock.now_s = 0.1
    assert await limiter.acquire("k", TEN_PER_S, cost=7) == Allowed(remaining=0, reset_after_ms=1000)


async def test_cost_beyond_capacity_is_a_caller_error(limiter: MemoryRateLimiter) -> None:
    with pytest.raises(ValueError, match="exceeds capacity"):
        await limiter.acquire("k", TEN_PER_S, cost=11)
    with pytest.raises(ValueError, match="cost must be >= 0"):
        await limiter.acquire("k", TEN_PER_S, cost=-1)


async def test_retry_after_ms_is_the_exact_wait_rounded_up(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    rule = Rule("seven-per-min", limit=7, period_s=60.0)  # T = 8571.43 ms
    for _ in range(7):
        await limiter.acquire("k", rule)
    clock.now_s = 1.0

    rejected = await limiter.acquire("k", rule)

    assert rejected == RetryAfter(retry_after_ms=7572, reset_after_ms=59000)
    clock.now_s = 1.0 + 7.571
    assert not await limiter.acquire("k", rule)
    clock.now_s = 1.0 + 7.572
    assert await limiter.acquire("k", rule)


async def test_rejected_requests_do_not_consume(limiter: MemoryRateLimiter, clock: FakeClock) -> None:
    for _ in range(10):
        await limiter.acquire("k", TEN_PER_S)
    clock.now_s = 0.05
    for _ in range(100):
        assert await limiter.acquire("k", TEN_PER_S) == RetryAfter(retry_after_ms=50, reset_after_ms=950)

    clock.now_s = 0.1
    assert await limiter.acquire("k", TEN_PER_S)


async def test_keys_are_independent(limiter: MemoryRateLimiter) -> None:
    for _ in range(10):
        await limiter.acquire("a", TEN_PER_S)

    assert await limiter.acquire("b", TEN_PER_S) == Allowed(remaining=9, reset_after_ms=100)


async def test_soft_mode_admits_overshoot_and_flags_it(limiter: MemoryRateLimiter) -> None:
    rule = Rule("soft", limit=10, period_s=1.0, mode="soft", overshoot_pct=20)

    decisions = [await limiter.acquire("k", rule) for _ in range(13)]

    assert [d.over_limit for d in decisions[:12] if isinstance(d, Allowed)] == [False] * 10 + [True] * 2
    assert decisions[9] == Allowed(remaining=0, reset_after_ms=1000)
    assert decisions[13 - 1] == RetryAfter(retry_after_ms=84, reset_after_ms=1000)  # T = 83.3 ms


async def test_soft_mode_sustains_limit_plus_overshoot(limiter: MemoryRateLimiter, clock: FakeClock) -> None:
    rule = Rule("soft", limit=10, period_s=1.0, mode="soft", overshoot_pct=20)
    admitted = nominal = 0
    for tick in range(10_001):  # 1000 attempts/s for 10 s
        clock.now_s = tick / 1000
        decision = await limiter.acquire("k", rule)
        admitted += bool(decision)
        nominal += isinstance(decision, Allowed) and not decision.over_limit

    assert admitted == 12 * 10 + 12
    assert 10 * 10 + 10 - 2 <= nominal <= 10 * 10 + 10


async def test_elastic_mode_borrows_spare_pool_capacity(limiter: MemoryRateLimiter, clock: FakeClock) -> None:
    pool = ElasticPool("provider:acme", Rule("acme-account", limit=20, period_s=1.0))
    rule = Rule("tenant", limit=5, period_s=1.0, mode="elastic", elastic_pool=pool)

    tenant_a = [await limiter.acquire("tenant:a", rule) for _ in range(30)]
    tenant_b = [await limiter.acquire("tenant:b", rule) for _ in range(6)]

    assert [bool(d) for d in tenant_a] == [True] * 20 + [False] * 10
    assert [isinstance(d, Allowed) and d.over_limit for d in tenant_a[:20]] == [False] * 5 + [True] * 15
    assert tenant_a[20] == RetryAfter(retry_after_ms=200, reset_after_ms=1000)  # tenant a's own allowance
    # a tenant's own allowance holds even when the pool is exhausted; it just cannot borrow
    assert [bool(d) for d in tenant_b] == [True] * 5 + [False]
    clock.now_s = 0.05  # the pool refilled one event (T = 50 ms); tenant a's own bucket has not
    assert await limiter.acquire("tenant:a", rule) == Allowed(
        remaining=0, reset_after_ms=950, over_limit=True
    )
    assert not await limiter.acquire("tenant:a", rule)


async def test_a_read_only_pool_lends_its_spare_capacity_without_being_charged(
    limiter: MemoryRateLimiter, clock: FakeClock
) -> None:
    pacing = Rule("acme-account", limit=4, period_s=1.0)  # its owner charges it for every call
    cap = Rule(
        "cap", limit=1, period_s=1.0, mode="elastic", elastic_pool=ElasticPool("provider:acme", pacing, True)
    )
    assert await limiter.acquire("provider:acme", pacing)

    own = await limiter.acquire("user:a", cap)
    borrowed = [await limiter.acquire("user:a", cap) for _ in range(5)]

    assert own == Allowed(remaining=0, reset_after_ms=1000)
    # over its own limit it borrows while the pool has room; reading the pool never fills it
    assert borrowed == [Allowed(remaining=0, reset_after_ms=1000, over_limit=True)] * 5
    assert [bool(await limiter.acquire("provider:acme", pacing)) for _ in range(4)] == [True] * 3 + [False]
    # the owner filled the pool: the elastic rule is held at its own limit
    assert await limiter.acquire("user:a", cap) == RetryAfter(retry_after_ms=1000, reset_after_ms=1000)
    clock.now_s = 0.25  # one pool slot back (T = 250 ms); the cap's own bucket is still empty
    assert (await limiter.acquire("user:a", cap)) == Allowed(0, 750, over_limit=True)


async def test_a_read_only_soft_pool_lends_only_below_its_nominal_limit(limiter: MemoryRateLimiter) -> None:
    pacing = Rule("acme-account", limit=2, period_s=1.0, mode="soft", overshoot_pct=100)
    cap = Rule(
        "cap", limit=1, period_s=1.0, mode="elastic", elastic_pool=ElasticPool("provider:acme", pacing, True)
    )
    assert await limiter.acquire("user:a", cap)
    assert await limiter.acquire("provider:acme", pacing)
    assert await limiter.acquire("user:a", cap)  # nominal room left: borrowed

    assert await limiter.acquire("provider:acme", pacing)  # nominal limit reached, overshoot left
    assert not await limiter.acquire("user:a", cap)


async def test_acquire_many_equals_sequential_acquire(clock: FakeClock) -> None:
    requests = [(f"k{i % 3}", TEN_PER_S, 1 + i % 4) for i in range(20)]
    batched, sequential = MemoryRateLimiter(clock=clock), MemoryRateLimiter(clock=clock)

    many = await batched.acquire_many(requests)

    assert many == [await sequential.acquire(key, rule, cost) for key, rule, cost in requests]


def test_headers_round_ms_up_to_seconds() -> None:
    assert rate_limit_headers(TEN_PER_S, RetryAfter(retry_after_ms=1001, reset_after_ms=1500)) == {
        "RateLimit-Limit": "10",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "2",
        "Retry-After": "2",
    }
    assert "Retry-After" not in rate_limit_headers(TEN_PER_S, Allowed(remaining=3, reset_after_ms=700))


def test_invalid_rules_are_rejected() -> None:
    with pytest.raises(ValueError):
        Rule("zero", limit=0, period_s=1.0)
    with pytest.raises(ValueError):
        Rule("elastic-without-pool", limit=1, period_s=1.0, mode="elastic")


async def test_build_without_url_is_in_process() -> None:
    limiter = build_rate_limiter(None)
    assert isinstance(limiter, MemoryRateLimiter)
    assert await limiter.acquire("k", TEN_PER_S)
    await limiter.aclose()


async def test_a_cost_of_zero_reads_the_room_and_charges_nothing() -> None:
    limiter = MemoryRateLimiter(clock=lambda: 1_000.0)
    assert await limiter.acquire("k", HOURLY, 0) == Allowed(10, 0)
    assert await limiter.acquire("k", HOURLY, 4)
    for _ in range(3):  # a look, however often, leaves the bucket as it was
        assert await limiter.acquire("k", HOURLY, 0) == Allowed(6, 1_440_000)
    assert await limiter.acquire("k", HOURLY, 6)
    assert await limiter.acquire("k", HOURLY, 0) == Allowed(0, 3_600_000)
    assert not await limiter.acquire("k", HOURLY, 1)


async def test_a_look_at_a_soft_rule_whose_own_bucket_is_full_promises_no_room() -> None:
    """A look at the shadow alone said 2 while the charge would be refused: the relay released
    nothing and the tenant's other rules kept the charge every pass (a hostile probe)."""
    limiter = MemoryRateLimiter(clock=lambda: 1_000.0)
    soft = Rule("soft", limit=10, period_s=3600.0, mode="soft", overshoot_pct=30)  # own bucket 13
    assert await limiter.acquire("k", soft, 8)
    assert (await limiter.acquire("k", soft, 5)).over_limit  # past the nominal 10, within 13
    look = await limiter.acquire("k", soft, 0)
    assert look.remaining == 0
    assert not await limiter.acquire("k", soft, 1)
    # the next one fits the rule's own bucket (276.9 s an event) after 276.9 s: as a nominal debt
    assert look.reset_after_ms == 3_600_000 + 276_924 - 360_000
