"""``workers.content_dedupe``, both stores (PostgreSQL, and Redis under the test run's key prefix),
called directly: who owns content for the window, and when a copy is a ``duplicate``.

The notifications are real rows (scheduled sends two hours out, which no worker touches); each
test sets their status as the pipeline would (claimed ``sending``, then ``sent`` or ``failed``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest
from redis.asyncio import Redis

from clarion.rules import RulesCache
from core.render import RenderedContent
from schema.enums import Status
from tests.conftest import TenantInfo
from tests.fixtures.claimed import claimed
from tests.fixtures.redis_limiter import REDIS_URL, fresh_prefix
from tests.fixtures.sends import email_send
from workers.claim import ClaimedNotification
from workers.content_dedupe import ContentDedupeGate, build_content_dedupe

WINDOW_S = 60
CONTENT = RenderedContent(subject="Shipped", body="Order 123 is on its way", html=None)


@pytest.fixture
async def windowed(client: httpx.AsyncClient) -> None:
    response = await client.put("/v1/tenant/settings", json={"content_dedupe_window_s": WINDOW_S})
    assert response.status_code == 200, response.text


@pytest.fixture
async def redis_prefix() -> AsyncIterator[str]:
    prefix = fresh_prefix()
    yield prefix
    redis = Redis.from_url(REDIS_URL)
    try:
        keys = [key async for key in redis.scan_iter(match=prefix + "*")]
        if keys:
            await redis.delete(*keys)
    finally:
        await redis.aclose()


@pytest.fixture(params=["postgresql", "redis"])
async def gate(
    request: pytest.FixtureRequest, pool: asyncpg.Pool, windowed: None, redis_prefix: str
) -> AsyncIterator[ContentDedupeGate]:
    """The gate as the worker builds it: on Redis when a URL is configured, else on PostgreSQL."""
    url = REDIS_URL if request.param == "redis" else None
    made = build_content_dedupe(
        rules=RulesCache.from_pool(pool), pool=pool, redis_url=url, key_prefix=redis_prefix
    )
    yield made
    if made.redis is not None:
        await made.redis.aclose()


class Log:
    """Notifications of the test's tenant, made through the API and set to a status in the log."""

    def __init__(self, client: httpx.AsyncClient, pool: asyncpg.Pool, tenant: TenantInfo) -> None:
        self.client, self.pool, self.tenant = client, pool, tenant

    async def new(self, user: str = "u-1") -> ClaimedNotification:
        later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
        body = email_send(send_at=later, user={"id": user, "email": f"{user}@example.com"})
        response = await self.client.post("/v1/notifications", json=body)
        assert response.status_code == 202, response.text
        nid = UUID(response.json()["id"])
        user_id = await self.pool.fetchval("SELECT user_id FROM notifications WHERE id = $1", nid)
        return claimed(id=nid, tenant_id=self.tenant.id, user_id=user_id, channel="email")

    async def claimed(self, user: str = "u-1") -> ClaimedNotification:
        """A new notification, ``sending`` under a lease that outlasts the test."""
        row = await self.new(user)
        await self.mark(row, "sending")
        return row

    async def mark(self, row: ClaimedNotification, status: str, *, ago_s: float = 0) -> None:
        await self.pool.execute(
            "UPDATE notifications SET status = $2, lease_until = now() + interval '1 hour',"
            " updated_at = now() - make_interval(secs => $3) WHERE id = $1",
            row.id,
            status,
            ago_s,
        )


@pytest.fixture
def log(client: httpx.AsyncClient, pool: asyncpg.Pool, tenant: TenantInfo) -> Log:
    return Log(client, pool, tenant)


def duplicate_of(outcome: Any, owner: ClaimedNotification) -> bool:
    return (
        outcome is not None
        and (outcome.status, outcome.error_code, outcome.detail)
        == (Status.duplicate, "content_duplicate", f"duplicate of {owner.id}")
        and str(owner.id) in outcome.error_message
    )


async def test_the_first_owns_the_content_and_a_copy_within_the_window_is_a_duplicate(
    gate: ContentDedupeGate, log: Log
) -> None:
    owner = await log.claimed()
    assert await gate.admit(owner, CONTENT, []) is None

    copy = await log.claimed()
    assert duplicate_of(await gate.admit(copy, CONTENT, []), owner)
    await log.mark(owner, "sent")
    assert duplicate_of(await gate.admit(await log.claimed(), CONTENT, []), owner)


async def test_the_owners_own_retry_is_not_a_duplicate_of_itself(gate: ContentDedupeGate, log: Log) -> None:
    owner = await log.claimed()
    assert await gate.admit(owner, CONTENT, []) is None
    assert await gate.admit(owner, CONTENT, []) is None  # claimed again: a retry or a redelivery
    assert duplicate_of(await gate.admit(await log.claimed(), CONTENT, []), owner)


async def test_other_content_or_another_user_is_not_a_copy(gate: ContentDedupeGate, log: Log) -> None:
    assert await gate.admit(await log.claimed(), CONTENT, []) is None
    other = RenderedContent(subject=CONTENT.subject, body="Order 456 is on its way", html=None)
    assert await gate.admit(await log.claimed(), other, []) is None
    assert await gate.admit(await log.claimed(user="u-2"), CONTENT, []) is None


@pytest.mark.parametrize("ended", ["failed", "throttled", "expired", "dead"])
async def test_a_copy_takes_over_from_an_owner_that_ended_unsent(
    gate: ContentDedupeGate, log: Log, ended: str
) -> None:
    owner = await log.claimed()
    assert await gate.admit(owner, CONTENT, []) is None
    await log.mark(owner, ended)

    heir = await log.claimed()
    assert await gate.admit(heir, CONTENT, []) is None
    await log.mark(heir, "sent")
    assert duplicate_of(await gate.admit(await log.claimed(), CONTENT, []), heir)


async def test_without_a_window_nothing_is_a_duplicate_nor_stamped(pool: asyncpg.Pool, log: Log) -> None:
    """The tenant never set ``content_dedupe_window_s`` (no ``windowed`` fixture here)."""
    gate = build_content_dedupe(rules=RulesCache.from_pool(pool), pool=pool, redis_url=None)
    owner = await log.claimed()
    assert await gate.admit(owner, CONTENT, []) is None
    assert await gate.admit(await log.claimed(), CONTENT, []) is None
    assert await pool.fetchval("SELECT content_hash FROM notifications WHERE id = $1", owner.id) is None


async def test_on_postgresql_an_owner_last_changed_before_the_window_no_longer_owns(
    pool: asyncpg.Pool, windowed: None, log: Log
) -> None:
    gate = build_content_dedupe(rules=RulesCache.from_pool(pool), pool=pool, redis_url=None)
    owner = await log.claimed()
    assert await gate.admit(owner, CONTENT, []) is None
    await log.mark(owner, "sent", ago_s=WINDOW_S + 1)
    assert await gate.admit(await log.claimed(), CONTENT, []) is None
    await log.mark(owner, "sent", ago_s=WINDOW_S - 5)
    assert duplicate_of(await gate.admit(await log.claimed(), CONTENT, []), owner)


async def test_on_redis_the_owner_is_kept_for_the_window_only(
    pool: asyncpg.Pool, windowed: None, log: Log, redis_prefix: str
) -> None:
    gate = build_content_dedupe(
        rules=RulesCache.from_pool(pool), pool=pool, redis_url=REDIS_URL, key_prefix=redis_prefix
    )
    owner = await log.claimed()
    try:
        assert await gate.admit(owner, CONTENT, []) is None
        digest = gate.renderer.content_hash(CONTENT, recipient=str(owner.user_id), channel="email")
        key = f"{redis_prefix}cd:{owner.tenant_id}:{owner.user_id}:email:{digest}"
        assert await gate.redis.get(key) == str(owner.id).encode()
        assert 0 < await gate.redis.ttl(key) <= WINDOW_S
    finally:
        await gate.redis.aclose()


async def test_with_redis_unreachable_the_gate_lets_copies_through(
    pool: asyncpg.Pool, windowed: None, log: Log, caplog: pytest.LogCaptureFixture
) -> None:
    gate = build_content_dedupe(
        rules=RulesCache.from_pool(pool),
        pool=pool,
        redis_url="redis://127.0.0.1:1/0",  # nothing listens on port 1
        key_prefix=fresh_prefix(),
    )
    try:
        with caplog.at_level(logging.WARNING, logger="workers.content_dedupe"):
            assert await gate.admit(await log.claimed(), CONTENT, []) is None
            assert await gate.admit(await log.claimed(), CONTENT, []) is None
    finally:
        await gate.redis.aclose()
    assert sum("Redis unavailable" in r.getMessage() for r in caplog.records) == 2
