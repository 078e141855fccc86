"""The Redis limiter: same GCRA decisions as the memory backend, shared across processes, fails open."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from core.limiter import build_rate_limiter
from core.ratelimit import Allowed, RetryAfter, Rule
from core.ratelimit_fail_open import FAIL_OPEN_METRIC
from core.ratelimit_lua import CHUNK
from core.ratelimit_memory import MemoryRateLimiter
from core.ratelimit_redis import RedisRateLimiter
from harness.services import wait_until
from tests.fixtures.ratelimit import HOURLY, TIMELINES, assert_close

REDIS_URL = "redis://127.0.0.1:6379/0"
REPO_ROOT = Path(__file__).resolve().parents[2]
CROSS_PROCESS_DURATION_S = 10.0
CROSS_PROCESS_WORKERS = 4
CROSS_PROCESS_RULE = Rule("cross-process", limit=500, period_s=1.0)


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    client = Redis.from_url(REDIS_URL)
    yield client
    await client.aclose()


@pytest.fixture
async def prefix(redis: Redis) -> AsyncIterator[str]:
    prefix = f"clarion-test:{uuid.uuid4()}:"
    yield prefix
    keys = [key async for key in redis.scan_iter(match=prefix + "*")]
    if keys:
        await redis.delete(*keys)


@pytest.fixture
async def limiter(prefix: str) -> AsyncIterator[RedisRateLimiter]:
    limiter = RedisRateLimiter.from_url(REDIS_URL, prefix=prefix, registry=CollectorRegistry())
    yield limiter
    await limiter.aclose()


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


async def test_unreachable_redis_fails_open_counts_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    limiter = RedisRateLimiter.from_url("redis://127.0.0.1:1", registry=registry, retry_interval_s=0)
    caplog.set_level(logging.WARNING, logger="core.ratelimit_fail_open")

    single = [await limiter.acquire("k", HOURLY) for _ in range(20)]
    batch = await limiter.acquire_many([("k", HOURLY, 1), ("k", Rule("other", 1, 1.0), 1)])
    concurrent = await asyncio.gather(*(limiter.acquire("k", HOURLY) for _ in range(5)))

    assert all(isinstance(d, Allowed) for d in single + batch + list(concurrent))
    assert registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": "hourly"}) == 26
    assert registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": "other"}) == 1
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1
    await limiter.aclose()


class TcpProxy:
    """Forwards a local port to Redis; stopping it makes Redis unreachable for the client."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        self._writers.clear()
        await self._server.wait_closed()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        redis_reader, redis_writer = await asyncio.open_connection("127.0.0.1", 6379)
        self._writers += [client_writer, redis_writer]

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        await asyncio.gather(pump(client_reader, redis_writer), pump(redis_reader, client_writer))


async def test_recovers_when_redis_returns(prefix: str) -> None:
    proxy = TcpProxy()
    await proxy.start()
    registry = CollectorRegistry()
    limiter = RedisRateLimiter.from_url(
        f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix, registry=registry, retry_interval_s=0.05
    )
    rule = Rule("recovery", limit=2, period_s=3600.0)
    assert [bool(await limiter.acquire("k", rule)) for _ in range(3)] == [True, True, False]

    await proxy.stop()
    during_outage = [await limiter.acquire("k", rule) for _ in range(5)]
    await proxy.start()
    await wait_until(lambda: not limiter._fail_open.skipping(), timeout_s=1.0, interval_s=0.01)
    after = await limiter.acquire("k", rule)

    assert all(isinstance(d, Allowed) for d in during_outage)
    assert registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": "recovery"}) == 5
    assert isinstance(after, RetryAfter)  # enforcing again, with the state kept in Redis
    await limiter.aclose()
    await proxy.stop()


async def test_build_with_url_is_redis(prefix: str) -> None:
    limiter = build_rate_limiter(REDIS_URL, prefix=prefix)
    assert isinstance(limiter, RedisRateLimiter)
    assert_close([await limiter.acquire("k", HOURLY)], [Allowed(remaining=9, reset_after_ms=360_000)])
    await limiter.aclose()


HAMMER = textwrap.dedent(
    """
    import asyncio, json, sys, time
    from core.ratelimit import Rule
    from core.ratelimit_redis import RedisRateLimiter

    async def main(url, prefix, start_at, duration_s, attempts_per_s, limit, period_s):
        limiter = RedisRateLimiter.from_url(url, prefix=prefix, timeout_s=2.0)
        rule = Rule("cross-process", limit=limit, period_s=period_s)
        await limiter.acquire("warmup", rule)  # connect and load the script before the clock starts
        # these sleeps pace the load (a start line, attempts_per_s): the thing measured, not a wait
        await asyncio.sleep(max(0.0, start_at - time.time()))
        admitted = attempts = 0
        first_sent_s = last_answered_s = None
        next_at = time.monotonic()
        while time.time() < start_at + duration_s:
            sent_s = time.time()
            decision = await limiter.acquire("shared", rule)
            last_answered_s = time.time()
            first_sent_s = first_sent_s or sent_s
            attempts += 1
            admitted += bool(decision)
            next_at += 1.0 / attempts_per_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        await limiter.aclose()
        print(json.dumps({"admitted": admitted, "attempts": attempts,
                          "first_sent_s": first_sent_s, "last_answered_s": last_answered_s}))

    url, prefix, start_at, duration_s, rate, limit, period_s = sys.argv[1:]
    asyncio.run(
        main(url, prefix, float(start_at), float(duration_s), float(rate), int(limit), float(period_s))
    )
    """
)


@pytest.mark.slow  # several processes hammering one key: its 1% bound wobbles on a busy 2-core runner
def test_processes_sharing_one_key_admit_within_one_percent_of_the_limit(prefix: str) -> None:
    rule = CROSS_PROCESS_RULE
    attempts_per_s = 10 * rule.limit / rule.period_s / CROSS_PROCESS_WORKERS
    start_at = time.time() + 2.5
    args = [REDIS_URL, prefix, str(start_at), str(CROSS_PROCESS_DURATION_S), str(attempts_per_s)]
    args += [str(rule.limit), str(rule.period_s)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HAMMER, *args], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True
        )
        for _ in range(CROSS_PROCESS_WORKERS)
    ]
    results = [json.loads(proc.communicate(timeout=CROSS_PROCESS_DURATION_S + 30)[0]) for proc in procs]

    admitted = sum(r["admitted"] for r in results)
    attempts = sum(r["attempts"] for r in results)
    elapsed_s = max(r["last_answered_s"] for r in results) - min(r["first_sent_s"] for r in results)
    expected = rule.limit * elapsed_s / rule.period_s + rule.capacity
    print(f"admitted={admitted} attempts={attempts} elapsed_s={elapsed_s:.3f} expected={expected:.1f}")
    assert attempts >= 5 * admitted  # the key really was hammered well above its limit
    assert abs(admitted - expected) <= 0.01 * expected
