"""The Redis limiter batches: many acquires in one round trip, decided as if in call order, each
caller's failure or cancellation its own."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from core.ratelimit import Allowed
from core.ratelimit_memory import MemoryRateLimiter
from core.ratelimit_redis import RedisRateLimiter
from tests.fixtures.ratelimit import HOURLY, TIMELINES, assert_close
from tests.fixtures.redis_limiter import REDIS_URL, limiter_fixture, prefix_fixture, redis_fixture  # noqa: F401 - fixtures


@pytest.mark.parametrize("spread", [1, 20])
async def test_acquire_many_equals_sequential_in_one_round_trip(
    limiter: RedisRateLimiter, prefix: str, monkeypatch: pytest.MonkeyPatch, spread: int
) -> None:
    # spread=20 makes more requests than one EVALSHA takes, so they go as one pipeline
    requests = [(f"k{i % (3 * spread)}", HOURLY, 1 + i % 4) for i in range(60 * spread)]
    requests += [step for steps in TIMELINES.values() for step in steps]
    sequential = [await limiter.acquire(key, rule, cost) for key, rule, cost in requests]
    batching = RedisRateLimiter.from_url(REDIS_URL, prefix=prefix + "many:", registry=CollectorRegistry())
    await batching.acquire("warmup", HOURLY)  # loads the script
    round_trips = 0

    def counting(method):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal round_trips
            round_trips += 1
            return method(*args, **kwargs)

        return call

    monkeypatch.setattr(batching, "_round_trip", counting(batching._round_trip))

    batched = await batching.acquire_many(requests)

    assert round_trips == 1
    assert_close(batched, sequential)
    await batching.aclose()


async def test_concurrent_acquires_share_one_round_trip_in_call_order(
    limiter: RedisRateLimiter, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = [("k", HOURLY, 1 + i % 3) for i in range(8)] + [("j", HOURLY, 1)] * 12
    memory = MemoryRateLimiter(clock=lambda: 1000.0)
    expected = [await memory.acquire(key, rule, cost) for key, rule, cost in requests]
    await limiter.acquire("warmup", HOURLY)  # loads the script
    round_trips = 0
    real = limiter._round_trip

    async def counting(commands: list[bytes]) -> list[object]:
        nonlocal round_trips
        round_trips += 1
        return await real(commands)

    monkeypatch.setattr(limiter, "_round_trip", counting)

    decisions = await asyncio.gather(*(limiter.acquire(key, rule, cost) for key, rule, cost in requests))

    assert round_trips == 1
    assert_close(list(decisions), expected)


async def test_a_request_that_never_fits_fails_only_its_own_caller(limiter: RedisRateLimiter) -> None:
    calls = [
        limiter.acquire("k", HOURLY),
        limiter.acquire("k", HOURLY, cost=11),
        limiter.acquire("k", HOURLY),
    ]

    first, impossible, third = await asyncio.gather(*calls, return_exceptions=True)

    assert isinstance(impossible, ValueError)
    assert_close([first, third], [Allowed(9, 360_000), Allowed(8, 720_000)])  # type: ignore[list-item]


async def test_a_cancelled_caller_leaves_the_others_their_decisions(limiter: RedisRateLimiter) -> None:
    tasks = [asyncio.create_task(limiter.acquire("k", HOURLY)) for _ in range(3)]
    await asyncio.sleep(0)  # all three have joined the pending batch
    tasks[1].cancel()

    results = await asyncio.gather(*tasks, return_exceptions=True)

    assert isinstance(results[1], asyncio.CancelledError)
    assert isinstance(results[0], Allowed) and isinstance(results[2], Allowed)
    assert_close([await limiter.acquire("k", HOURLY)], [Allowed(6, 1_440_000)])  # the batch ran all three
