"""Dedupe beyond the event id: a content window per tenant, and no second provider call for a
``sent`` notification however often it is republished."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import asyncpg
import httpx
import pytest
import sqlalchemy as sa
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion import metrics
from clarion.kafka import Publisher
from clarion.pg import create_pool
from clarion.rules import RulesCache
from clarion.settings import Settings
from core.render import RenderedContent, Renderer
from harness.services import wait_until
from schema.enums import Channel
from schema.messages import NotificationMessage
from tests.conftest import Stack, TenantInfo
from tests.fixtures.claimed import claimed
from tests.fixtures.delivery import sandbox_for, status_of, wait_status
from tests.fixtures.redis_cluster import start_cluster
from tests.fixtures.redis_limiter import fresh_prefix
from tests.fixtures.rules import wait_workers_see
from tests.fixtures.sends import email_send
from workers.claim import ClaimedNotification
from workers.content_dedupe import ContentDedupeGate, build_content_dedupe
from workers.recipients import Address

REDIS_URL = "redis://127.0.0.1:6379/0"


async def set_window(
    stack: Stack, client: httpx.AsyncClient, tenant: TenantInfo, window_s: int | None
) -> None:
    response = await client.put("/v1/tenant/settings", json={"content_dedupe_window_s": window_s})
    assert response.status_code == 200, response.text
    await wait_workers_see(stack, lambda snapshot: snapshot.dedupe_window_s(tenant.id) == window_s)


async def send(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    response = await client.post("/v1/notifications", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def final(client: httpx.AsyncClient, nid: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        body = await status_of(client, nid)
        return body if body["status"] in ("sent", "duplicate", "failed") else None

    return dict(await wait_until(done, 15))


async def test_same_content_to_the_same_user_within_the_window_is_a_duplicate(
    stack: Stack, client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    await set_window(stack, client, tenant, 60)
    first = await send(client, email_send())
    await wait_status(client, first, "sent")
    again = await final(client, await send(client, email_send()))
    assert again["status"] == "duplicate"
    assert again["error"]["code"] == "content_duplicate"
    assert first in again["error"]["message"]
    assert await sandbox_for(client, again["id"]) == []
    # other content, or the same content to another user, is sent
    other = await send(client, email_send(data={"order_id": "456"}))
    elsewhere = await send(client, email_send(user={"id": "u-2", "email": "bob@example.com"}))
    assert (await final(client, other))["status"] == "sent"
    assert (await final(client, elsewhere))["status"] == "sent"


async def test_identical_sends_arriving_together_are_sent_once(
    stack: Stack, client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    await set_window(stack, client, tenant, 60)
    ids = await asyncio.gather(*(send(client, email_send()) for _ in range(6)))
    statuses = sorted([(await final(client, nid))["status"] for nid in ids])
    assert statuses == ["duplicate"] * 5 + ["sent"]


async def test_without_a_window_identical_sends_are_all_sent(stack: Stack, client: httpx.AsyncClient) -> None:
    ids = [await send(client, email_send()) for _ in range(2)]
    assert [(await final(client, nid))["status"] for nid in ids] == ["sent", "sent"]


async def test_a_sent_notification_republished_many_times_reaches_the_provider_once(
    stack: Stack, client: httpx.AsyncClient, engine: AsyncEngine, settings: Settings
) -> None:
    nid = await send(client, email_send())
    await wait_status(client, nid, "sent")
    async with engine.connect() as conn:
        user_id, tenant_id = (
            await conn.execute(
                sa.text("SELECT user_id, tenant_id FROM notifications WHERE id = :i"), {"i": nid}
            )
        ).one()
    message = NotificationMessage(id=UUID(nid), tenant_id=tenant_id, channel=Channel.email, user_id=user_id)
    skipped = metrics.DEDUPED.labels("email")
    before = skipped._value.get()
    copies = 30
    publisher = Publisher(settings.kafka_bootstrap or "")
    try:  # what the relay does when it republishes: publish_many from the log
        for _ in range(3):
            assert len(await publisher.publish_many([message] * (copies // 3))) == copies // 3
    finally:
        await publisher.close()
    # a later send to the same user shares the partition: once it is sent, every copy was consumed
    later = await send(client, email_send(data={"order_id": "later"}))
    await wait_status(client, later, "sent")
    assert skipped._value.get() > before
    assert len(await sandbox_for(client, nid)) == 1
    body = await status_of(client, nid)
    assert body["status"] == "sent" and len(body["delivery_attempts"]) == 1


class Windows:
    def __init__(self, windows: dict[str, int]) -> None:
        self.windows = windows

    async def fetch(self, sql: str) -> Sequence[Mapping[str, Any]]:
        if "rate_limit_rules" in sql:
            return []
        return [{"id": t, "content_dedupe_window_s": w} for t, w in self.windows.items()]


@pytest.fixture
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(settings.database_url, size=2)
    yield p
    await p.close()


async def test_on_redis_one_of_many_concurrent_copies_wins_and_its_retries_are_not_duplicates(
    pool: asyncpg.Pool,
) -> None:
    redis = Redis.from_url(REDIS_URL)
    prefix = fresh_prefix()
    gate = ContentDedupeGate(
        rules=RulesCache(Windows({"t-1": 60}).fetch),
        pool=pool,
        renderer=Renderer(),
        redis=redis,
        key_prefix=prefix,
    )
    content = RenderedContent(subject="Hi", body="Your code is 1234", html=None)
    user = uuid.uuid4()

    def row(nid: UUID, tenant: str = "t-1", user_id: UUID = user) -> ClaimedNotification:
        return claimed(id=nid, tenant_id=tenant, user_id=user_id, channel="sms")

    try:
        ids = [uuid.uuid4() for _ in range(10)]
        outcomes = await asyncio.gather(*(gate.admit(row(i), content, [Address("+1")]) for i in ids))
        winners = [i for i, o in zip(ids, outcomes, strict=True) if o is None]
        assert len(winners) == 1
        assert {o.detail for o in outcomes if o is not None} == {f"duplicate of {winners[0]}"}
        assert await gate.admit(row(winners[0]), content, []) is None  # its own retry
        assert await gate.admit(row(uuid.uuid4(), user_id=uuid.uuid4()), content, []) is None
        assert await gate.admit(row(uuid.uuid4(), tenant="t-no-window"), content, []) is None
        assert (
            0
            < await redis.ttl(
                prefix
                + f"t-1:{user}:sms:"
                + gate.renderer.content_hash(content, recipient=str(user), channel="sms")
            )
            <= 60
        )
    finally:
        keys = [k async for k in redis.scan_iter(match=prefix + "*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()


async def test_on_redis_cluster_one_of_many_concurrent_copies_wins(
    pool: asyncpg.Pool, tmp_path: Path
) -> None:
    nodes = start_cluster(tmp_path)
    gate = build_content_dedupe(
        rules=RulesCache(Windows({"t-1": 60}).fetch),
        pool=pool,
        redis_url=nodes.url,
        key_prefix=fresh_prefix(),
    )
    content = RenderedContent(subject="Hi", body="Your code is 1234", html=None)
    user = uuid.uuid4()
    try:
        assert isinstance(gate.redis, RedisCluster)
        ids = [uuid.uuid4() for _ in range(10)]
        rows = [claimed(id=i, tenant_id="t-1", user_id=user, channel="sms") for i in ids]
        outcomes = await asyncio.gather(*(gate.admit(r, content, [Address("+1")]) for r in rows))
        winners = [i for i, o in zip(ids, outcomes, strict=True) if o is None]
        assert len(winners) == 1
        assert {o.detail for o in outcomes if o is not None} == {f"duplicate of {winners[0]}"}
        assert await gate.admit(rows[ids.index(winners[0])], content, []) is None  # its own retry
    finally:
        await gate.redis.aclose()  # type: ignore[union-attr]
        nodes.stop()
