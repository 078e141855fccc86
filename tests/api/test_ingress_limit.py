"""Ingress limits: a send over a tenant or API-key rule is a 429 a client can act on."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.settings import Settings
from clarion.tenants import create_api_key
from harness.services import ApiServer, api_client, wait_until
from tests.conftest import TenantInfo
from tests.fixtures.answers import assert_error
from tests.fixtures.rules import wait_loaded
from tests.fixtures.sends import count_notifications, email_send

REDIS_URL = "redis://127.0.0.1:6379/0"
PICKUP_S = 5.0


async def add_rule(client: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    response = await client.post("/v1/rate-limits", json={"scope": "tenant", **fields})
    assert response.status_code == 201, response.text
    return dict(response.json())


async def wait_enforced(client: httpx.AsyncClient) -> httpx.Response:
    """Send until the first 429: a new rule reaches the API within PICKUP_S."""

    async def refused() -> httpx.Response | None:
        response = await client.post("/v1/notifications", json=email_send())
        return response if response.status_code == 429 else None

    return await wait_until(refused, timeout_s=PICKUP_S, interval_s=0.2)  # type: ignore[no-any-return]


async def test_sends_over_the_tenant_limit_get_429_with_retry_after_and_ratelimit_headers(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    await add_rule(client, name="tenant-3-per-minute", limit=3, period_s=60)
    await wait_enforced(client)  # the rule is live: the bucket is now empty
    before = await count_notifications(engine, tenant.id)
    refused = await client.post("/v1/notifications", json=email_send())
    error = assert_error(refused, 429, "rate_limited")
    assert error["details"]["rule"] == "tenant-3-per-minute"
    # one send refills every 60/3 = 20 s: that is when a retry is admitted
    assert 19 <= int(refused.headers["Retry-After"]) <= 20
    assert refused.headers["RateLimit-Limit"] == "3"
    assert refused.headers["RateLimit-Remaining"] == "0"
    assert int(refused.headers["RateLimit-Reset"]) > 0
    assert await count_notifications(engine, tenant.id) == before  # nothing stored for a 429


async def test_accepted_sends_carry_the_remaining_budget(client: httpx.AsyncClient, api: ApiServer) -> None:
    rule = await add_rule(
        client, limit=1000, period_s=3600
    )  # one send refills every 3.6 s: not during the test
    await wait_loaded(api, rule)
    remaining = []
    for _ in range(3):
        response = await client.post("/v1/notifications", json=email_send())
        assert response.status_code == 202, response.text
        assert response.headers["RateLimit-Limit"] == "1000"
        remaining.append(int(response.headers["RateLimit-Remaining"]))
    assert remaining == [999, 998, 997]


async def test_waiting_retry_after_is_enough_and_retrying_sooner_is_not(client: httpx.AsyncClient) -> None:
    await add_rule(client, limit=2, period_s=2)
    refused = await wait_enforced(client)
    retry_after_s = int(refused.headers["Retry-After"])
    deadline = time.monotonic() + retry_after_s  # the refusal was decided before this reading
    assert retry_after_s == 1
    assert (await client.post("/v1/notifications", json=email_send())).status_code == 429
    refused_at: list[float] = []  # when each send that was still refused went out

    async def admitted() -> bool:
        sent_at = time.monotonic()
        status = (await client.post("/v1/notifications", json=email_send())).status_code
        assert status in (202, 429)
        if status == 429:
            refused_at.append(sent_at)
        return status == 202

    await wait_until(admitted, timeout_s=PICKUP_S, interval_s=0.05)
    # Retry-After is enough: no send made once it had passed was refused
    assert max(refused_at, default=0.0) < deadline


async def test_an_api_key_limit_counts_each_key_on_its_own(
    client: httpx.AsyncClient, api: ApiServer, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    await add_rule(client, scope="api_key", limit=1, period_s=600)
    await wait_enforced(client)
    async with engine.begin() as conn:
        second_key = await create_api_key(conn, tenant_id=tenant.id, name="second")
    async with api_client(api.url, second_key) as other:
        assert (await other.post("/v1/notifications", json=email_send())).status_code == 202
        assert (await other.post("/v1/notifications", json=email_send())).status_code == 429


async def test_a_disabled_or_deleted_rule_stops_refusing(client: httpx.AsyncClient) -> None:
    rule = await add_rule(client, limit=1, period_s=600)
    await wait_enforced(client)
    await client.put(
        f"/v1/rate-limits/{rule['id']}",
        json={"scope": "tenant", "limit": 1, "period_s": 600, "enabled": False},
    )
    start = time.monotonic()

    async def accepted() -> bool:
        return (await client.post("/v1/notifications", json=email_send())).status_code == 202

    await wait_until(accepted, timeout_s=PICKUP_S, interval_s=0.2)
    assert time.monotonic() - start < PICKUP_S


@pytest.fixture
async def two_apis_on_redis(settings: Settings) -> AsyncIterator[tuple[ApiServer, ApiServer]]:
    shared = settings.model_copy(update={"redis_url": REDIS_URL})
    servers = (ApiServer(shared), ApiServer(shared))
    for s in servers:
        await s.start()
    yield servers
    for s in servers:
        await s.stop()


async def test_every_api_process_shares_one_tenant_limit_on_redis(
    two_apis_on_redis: tuple[ApiServer, ApiServer], tenant: TenantInfo, settings: Settings
) -> None:
    first, second = two_apis_on_redis
    name = f"shared-{uuid.uuid4().hex[:8]}"
    async with api_client(first.url, tenant.key) as a, api_client(second.url, tenant.key) as b:
        rule = await add_rule(a, name=name, limit=4, period_s=600)
        for server in two_apis_on_redis:
            await wait_loaded(server, rule)
        codes = [
            (await c.post("/v1/notifications", json=email_send())).status_code for c in (a, b, a, b, a, b)
        ]
    assert codes == [202, 202, 202, 202, 429, 429]
    redis = Redis.from_url(REDIS_URL)
    try:
        keys = [k async for k in redis.scan_iter(match=f"{settings.redis_key_prefix}rl:ingress:*")]
        assert keys, "the decisions were taken on Redis"
    finally:
        await redis.aclose()


async def test_a_batch_costs_its_size_and_one_larger_than_the_limit_is_refused(
    client: httpx.AsyncClient, api: ApiServer
) -> None:
    rule = await add_rule(client, name="five-per-10-min", limit=5, period_s=600)
    await wait_loaded(api, rule)

    def batch(n: int) -> dict[str, Any]:
        return {"notifications": [email_send() for _ in range(n)]}

    too_big = await client.post("/v1/notifications/batch", json=batch(6))
    assert assert_error(too_big, 422, "batch_exceeds_rate_limit")["details"]["max_at_once"] == 5
    first = await client.post("/v1/notifications/batch", json=batch(3))
    assert first.status_code == 202, first.text
    assert first.headers["RateLimit-Remaining"] == "2"
    second = await client.post("/v1/notifications/batch", json=batch(3))
    assert_error(second, 429, "rate_limited")
    assert (await client.post("/v1/notifications/batch", json=batch(2))).status_code == 202
