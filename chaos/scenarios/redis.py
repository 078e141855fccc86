"""Scenario 5, Redis down: the rate limiter's Redis dies mid-load and comes back.

Rules that make every process consult the limiter: an ingress ``tenant`` rule (the API), a
``provider`` pacing rule and a ``recipient`` cap (the workers), all generous enough never to
refuse this load. With Redis gone the limiter fails open as designed (admits, counts
``clarion_ratelimit_fail_open_total``), no process crashes, every notification is sent; once
Redis is back the limiter uses it again (keys reappear, fail-open stops growing).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio as aioredis

from chaos.report import Result
from chaos.scenarios.common import scaled, settle, start_load
from chaos.stack import Stack, StackOptions

FULL = 4_000
FAIL_OPEN = "clarion_ratelimit_fail_open_total"
RULES = [
    {"name": "chaos-ingress", "scope": "tenant", "limit": 100_000, "period_s": 1},
    {"name": "chaos-pacing", "scope": "provider", "provider": "sandbox", "limit": 100_000, "period_s": 1},
    {"name": "chaos-cap", "scope": "recipient", "limit": 1_000, "period_s": 60, "action": "delay"},
]


async def fail_opens(stack: Stack) -> float:
    total = 0.0
    for name in [*stack.metrics_ports, "api"]:
        total += sum((await stack.scrape(name, FAIL_OPEN)).values())
    return total


async def redis_keys(stack: Stack) -> int:
    assert stack.redis is not None
    client = aioredis.from_url(stack.redis.url)
    try:
        return int(await client.dbsize())
    finally:
        await client.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose


async def run(scale: float, log_dir: Path, *, outage_s: float = 8.0) -> Result:
    count = scaled(FULL, scale)
    result = Result("5 redis down", count)
    async with Stack(StackOptions(redis=True), log_dir) as stack:
        for rule in RULES:
            status, body, _ = await stack.call("POST", "/v1/rate-limits", json_body=rule)
            if status != 201:
                raise RuntimeError(f"could not create rule {rule['name']}: {status} {body}")
        await asyncio.sleep(3.0)  # rules reach every process within clarion.rules.REFRESH_TTL_S
        half = count // 2
        first = start_load(stack, count=half, name="load-1")
        await first.until_answered(half // 3, 300)
        keys_before = await redis_keys(stack)
        stack.redis.stop()  # type: ignore[union-attr]
        await asyncio.sleep(outage_s)
        stack.redis.start()  # type: ignore[union-attr]
        await first.wait(600)
        await asyncio.sleep(8.0)  # the limiter retries Redis after its retry interval
        opened_before_second = await fail_opens(stack)
        second = start_load(stack, count=count - half, start=half, name="load-2")
        await second.wait(600)
        opened_after = await fail_opens(stack)
        keys_after = await redis_keys(stack)
        rec = await settle(stack, result, [first, second], drain_s=180)
        crashed = [p.name for ps in stack.workers.values() for p in ps if not p.running]
        crashed += [p.name for p in (stack.api, stack.relay) if p is not None and not p.running]
        result.figures.update(
            fail_open_admissions=opened_after,
            fail_open_after_recovery=opened_after - opened_before_second,
            redis_keys_before=keys_before,
            redis_keys_after=keys_after,
        )
        result.check(not crashed, f"processes died: {crashed}")
        result.check(opened_before_second > 0, "no fail-open admission was counted while Redis was down")
        result.check(keys_before > 0 and keys_after > 0, "the limiter did not use Redis before/after")
        result.check(opened_after - opened_before_second == 0, "still failing open after Redis came back")
        result.check(rec.sent == count, f"sent {rec.sent} of {count}")
        result.notes.append(
            f"Redis down {outage_s:.0f} s: {int(opened_before_second):,} fail-open admissions, no crash; "
            f"after recovery 0 new fail-opens, {keys_after} limiter keys in Redis"
        )
    return result
