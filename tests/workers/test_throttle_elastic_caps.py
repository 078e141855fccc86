"""Elastic caps: a cap sends above its limit while the provider's pacing has room to spare, on the
in-process limiter and on the real Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from redis.asyncio import Redis

from core.ratelimit import RateLimiter
from core.ratelimit_memory import MemoryRateLimiter
from core.ratelimit_redis import RedisRateLimiter
from tests.fixtures.redis_limiter import REDIS_URL, fresh_prefix
from tests.fixtures.throttle_gate import DEVICE, HELLO, NOW, admit_n, gate_for, notification, rule_row


@pytest.fixture(params=["memory", "redis"])
async def limiter(request: pytest.FixtureRequest) -> AsyncIterator[RateLimiter]:
    if request.param == "memory":
        yield MemoryRateLimiter()
        return
    prefix = fresh_prefix()
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
