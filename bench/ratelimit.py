"""Rate-limiter throughput: decisions per second in this one process, on the same Redis.

Run with ``python -m bench.ratelimit [redis_url]``. Every row hammers one key with a 10,000/s
rule for ``ROW_S`` seconds; admitted and rejected decisions both count. Keys are removed after.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry
from redis.asyncio import Redis

from core.ratelimit import Rule
from core.ratelimit_fail_open import FAIL_OPEN_METRIC
from core.ratelimit_memory import MemoryRateLimiter
from core.ratelimit_redis import RedisRateLimiter

ROW_S = 3.0
TASKS = 50
BATCH = 100
LIMIT_PER_S = 10_000
RULE = Rule("bench", limit=LIMIT_PER_S, period_s=1.0)


async def measure(tasks: int, step: Callable[[], Awaitable[int]]) -> float:
    """Decisions/s of ``tasks`` concurrent loops calling ``step`` (which returns decisions made)."""
    await step()  # warm up: connect, load scripts
    done = 0
    deadline = time.perf_counter() + ROW_S

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            decided = await step()  # not `done += await step()`: that reads `done` before awaiting
            done += decided

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(tasks)))
    return done / (time.perf_counter() - start)


async def clarion_rows(redis_url: str, prefix: str) -> list[tuple[str, float]]:
    registry = CollectorRegistry()  # a fail-open admission is fast and proves nothing: none may count
    limiter = RedisRateLimiter.from_url(redis_url, prefix=prefix, registry=registry)
    batch = [("bench", RULE, 1)] * BATCH

    async def single() -> int:
        await limiter.acquire("bench", RULE)
        return 1

    async def pipelined() -> int:
        return len(await limiter.acquire_many(batch))

    memory = MemoryRateLimiter()

    async def in_process() -> int:
        await memory.acquire("bench", RULE)
        return 1

    client = Redis.from_url(redis_url)

    async def ping() -> int:  # the ceiling: a round trip with no work, same client library
        await client.ping()
        return 1

    rows = [
        (f"(reference) redis-py PING, {TASKS} tasks", await measure(TASKS, ping)),
        (f"clarion Redis GCRA, single calls, {TASKS} tasks", await measure(TASKS, single)),
        (f"clarion Redis GCRA, acquire_many x{BATCH}, 1 task", await measure(1, pipelined)),
        (f"clarion Redis GCRA, acquire_many x{BATCH}, 4 tasks", await measure(4, pipelined)),
        ("clarion memory GCRA, 1 task", await measure(1, in_process)),
    ]
    await limiter.aclose()
    await client.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose
    if registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": RULE.rule_id}):
        raise SystemExit("the limiter failed open during the run: its figures are not decisions")
    return rows


async def limits_row(redis_url: str, prefix: str) -> tuple[str, float]:
    from limits import RateLimitItemPerSecond
    from limits.aio.strategies import SlidingWindowCounterRateLimiter
    from limits.storage import storage_from_string

    storage = storage_from_string(
        "async+" + redis_url, implementation="redispy", key_prefix=prefix + "limits"
    )
    limiter = SlidingWindowCounterRateLimiter(storage)  # type: ignore[arg-type]
    item = RateLimitItemPerSecond(LIMIT_PER_S)

    async def hit() -> int:
        await limiter.hit(item, "bench")
        return 1

    name = f"limits {version('limits')} async redis-py, sliding window counter, {TASKS} tasks"
    return name, await measure(TASKS, hit)


async def pyrate_row(redis_url: str, prefix: str) -> tuple[str, float]:
    from pyrate_limiter import Duration, Limiter, Rate, RedisBucket

    client = Redis.from_url(redis_url)
    bucket = await RedisBucket.init([Rate(LIMIT_PER_S, Duration.SECOND)], client, prefix + "pyrate")
    limiter = Limiter(bucket)

    async def acquire() -> int:
        await limiter.try_acquire_async("bench", blocking=False)
        return 1

    name = f"pyrate-limiter {version('pyrate-limiter')} RedisBucket (async), {TASKS} tasks"
    row = name, await measure(TASKS, acquire)
    await client.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose
    return row


def version(package: str) -> str:
    from importlib.metadata import version as installed

    return installed(package)


async def main(redis_url: str) -> None:
    prefix = f"clarion-bench:{uuid.uuid4()}:"
    print(f"{ROW_S:.0f} s per row, one key, {LIMIT_PER_S}/s rule, {redis_url}", flush=True)
    rows = await clarion_rows(redis_url, prefix)
    rows.append(await limits_row(redis_url, prefix))
    rows.append(await pyrate_row(redis_url, prefix))
    width = max(len(name) for name, _ in rows)
    print(f"{'limiter':<{width}}  decisions/s")
    for name, per_s in rows:
        print(f"{name:<{width}}  {per_s:>11,.0f}")
    client = Redis.from_url(redis_url)
    keys = [key async for key in client.scan_iter(match=prefix + "*")]
    keys += [key async for key in client.scan_iter(match="*" + prefix + "*")]
    if keys:
        await client.delete(*set(keys))
    await client.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(f"event loop: {asyncio.get_event_loop_policy().__class__.__module__}")
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "redis://127.0.0.1:6379/0"))
