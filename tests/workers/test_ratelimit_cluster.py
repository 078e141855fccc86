"""The limiter on a real three-node Redis Cluster: the one-Redis decisions, one EVALSHA per slot,
and failing open (counted) while a node restarts."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from redis.crc import key_slot

from core.limiter import build_rate_limiter
from core.ratelimit import Allowed, RetryAfter, Rule
from core.ratelimit_cluster import RedisClusterRateLimiter, cluster_url
from core.ratelimit_fail_open import FAIL_OPEN_METRIC
from core.ratelimit_memory import MemoryRateLimiter
from harness.services import wait_until
from tests.fixtures.ratelimit import HOURLY, TIMELINES, assert_close
from tests.fixtures.redis_cluster import RedisClusterNodes, start_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    nodes = start_cluster(Path(tmp_path_factory.mktemp("redis-cluster")))
    yield nodes
    nodes.stop()


@pytest.fixture
async def limiter(cluster: RedisClusterNodes) -> AsyncIterator[RedisClusterRateLimiter]:
    limiter = RedisClusterRateLimiter.from_url(
        cluster.url, prefix=f"t:{uuid.uuid4()}:", registry=CollectorRegistry(), retry_interval_s=0.05
    )
    yield limiter
    await limiter.aclose()


def _slot(limiter: RedisClusterRateLimiter, key: str) -> int:
    return int(key_slot(limiter.storage_key(key).encode()))


def _port_of(limiter: RedisClusterRateLimiter, key: str) -> int:
    return int(limiter._cluster.nodes_manager.get_node_from_slot(_slot(limiter, key)).port)


@pytest.mark.parametrize("timeline", TIMELINES)
async def test_cluster_decisions_match_the_memory_timeline(
    limiter: RedisClusterRateLimiter, timeline: str
) -> None:
    memory = MemoryRateLimiter(clock=lambda: 1000.0)
    expected = [await memory.acquire(key, rule, cost) for key, rule, cost in TIMELINES[timeline]]

    actual = [await limiter.acquire(key, rule, cost) for key, rule, cost in TIMELINES[timeline]]

    assert_close(actual, expected)
    # the elastic timelines' pool is on another slot than their keys: both split paths run
    assert _slot(limiter, "a") != _slot(limiter, "pool")


async def test_a_batch_over_every_node_decides_as_sequential_calls(
    limiter: RedisClusterRateLimiter, cluster: RedisClusterNodes
) -> None:
    requests = [(f"k{i % 40}", HOURLY, 1 + i % 4) for i in range(300)]
    requests += [(f"{name}:{k}", rule, cost) for name, steps in TIMELINES.items() for k, rule, cost in steps]
    memory = MemoryRateLimiter(clock=lambda: 1000.0)
    expected = [await memory.acquire(key, rule, cost) for key, rule, cost in requests]

    batched = await limiter.acquire_many(requests)

    assert {_port_of(limiter, key) for key, _, _ in requests} == set(cluster.ports)
    assert_close(batched, expected)


async def test_a_soft_key_and_its_shadow_share_a_slot(limiter: RedisClusterRateLimiter) -> None:
    assert _slot(limiter, "k") == _slot(limiter, "k|nominal")
    soft = Rule("soft", limit=1, period_s=3600.0, mode="soft", overshoot_pct=100)
    assert [bool(await limiter.acquire("x|nominal", soft)) for _ in range(3)] == [True, True, False]


async def test_a_restarted_node_fails_open_counted_while_others_enforce_then_recovers(
    cluster: RedisClusterNodes,
) -> None:
    registry = CollectorRegistry()
    limiter = RedisClusterRateLimiter.from_url(
        cluster.url, prefix=f"t:{uuid.uuid4()}:", registry=registry, retry_interval_s=0.05
    )
    rule = Rule("restart", limit=2, period_s=3600.0)
    keys = [f"k{i}" for i in range(30)]
    assert [bool(d) for d in await limiter.acquire_many([("k0", rule, 1)] * 3)] == [True, True, False]
    victim = _port_of(limiter, "k0")
    elsewhere = next(k for k in keys if _port_of(limiter, k) != victim)
    assert [bool(await limiter.acquire(elsewhere, rule)) for _ in range(3)] == [True, True, False]

    cluster.kill(victim)
    during = [await limiter.acquire("k0", rule) for _ in range(5)]
    other = await limiter.acquire(elsewhere, rule)

    assert all(isinstance(d, Allowed) for d in during)
    assert registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": "restart"}) == 5
    assert isinstance(other, RetryAfter)  # the nodes still up keep enforcing

    cluster.start(victim)  # its data is gone (no persistence), its slots and script cache too
    cluster.wait_ok()

    async def enforcing_again() -> bool:
        return [bool(d) for d in await limiter.acquire_many([("fresh", rule, 1)] * 3)] == [True, True, False]

    await wait_until(enforcing_again, timeout_s=15)
    failed_open = registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": "restart"})
    assert [bool(await limiter.acquire("k0", rule)) for _ in range(3)] == [True, True, False]
    assert registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": "restart"}) == failed_open
    await limiter.aclose()


def test_a_prefix_with_braces_is_refused(cluster: RedisClusterNodes) -> None:
    with pytest.raises(ValueError, match="braces"):
        RedisClusterRateLimiter.from_url(cluster.url, prefix="a{b}:")


async def test_a_cluster_url_builds_the_cluster_limiter(cluster: RedisClusterNodes) -> None:
    assert cluster_url("redis://h:1/0") is None
    assert cluster_url("rediss+cluster://h:1") == "rediss://h:1"
    limiter = build_rate_limiter(cluster.url, prefix=f"t:{uuid.uuid4()}:")

    assert isinstance(limiter, RedisClusterRateLimiter)
    # The first call discovers the cluster within the limiter's 0.25 s; on a loaded machine it can
    # fail open (admitted, counted, nothing spent: reset_after_ms 0), as the clean-clone CI's once
    # did. The first decision the cluster makes is the one checked.
    decided: list[Allowed | RetryAfter] = []

    async def by_the_cluster() -> bool:
        decision = await limiter.acquire("k", HOURLY)
        decided[:] = [decision] if decision.reset_after_ms else []
        return bool(decided)

    await wait_until(by_the_cluster, timeout_s=15)
    assert_close(decided, [Allowed(remaining=9, reset_after_ms=360_000)])
    await limiter.aclose()


async def test_a_fresh_limiter_used_by_many_tasks_at_once_decides_them_all(
    cluster: RedisClusterNodes,
) -> None:
    registry = CollectorRegistry()
    limiter = RedisClusterRateLimiter.from_url(cluster.url, prefix=f"t:{uuid.uuid4()}:", registry=registry)

    decisions = await asyncio.gather(*(limiter.acquire(f"k{i % 7}", HOURLY) for i in range(70)))

    assert sum(map(bool, decisions)) == 70  # 7 keys x 10
    assert registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": "hourly"}) is None
    assert not await limiter.acquire("k0", HOURLY)
    await limiter.aclose()
