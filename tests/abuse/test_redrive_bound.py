"""A tenant's redrive requeues at most ``MAX_REDRIVE_PER_CALL`` dead letters, no more than its
``tenant`` rule admits now, and says how many still match (``api/dlq.py``): a redrive puts them
into the lane every tenant shares, so neither one call nor calls in a loop may queue a million
ahead of everyone else's sends."""

from __future__ import annotations

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.dlq import RedriveFilter, redrive
from harness.services import ApiServer
from harness.tenants import TenantInfo
from schema.enums import Channel
from tests.fixtures.answers import assert_error
from tests.fixtures.hooks import sent_notification
from tests.fixtures.rules import wait_loaded


async def _dead(engine: AsyncEngine, tenant: TenantInfo, n: int) -> None:
    for _ in range(n):
        nid, _ = await sent_notification(engine, tenant, channel="sms")
        async with engine.begin() as conn:
            await conn.execute(
                sa.text("UPDATE notifications SET status = 'dead', error_code = 'e' WHERE id = :n"),
                {"n": nid},
            )


async def test_a_bounded_redrive_requeues_its_limit_and_names_what_remains(
    engine: AsyncEngine, tenant: TenantInfo
) -> None:
    await _dead(engine, tenant, 5)
    match = RedriveFilter()
    first = await redrive(
        engine=engine, publisher=None, tenant_id=tenant.id, channel=Channel.sms, match=match, batch=2, limit=3
    )
    assert (first.requeued, first.remaining) == (3, 2)
    rest = await redrive(
        engine=engine, publisher=None, tenant_id=tenant.id, channel=Channel.sms, match=match, batch=2, limit=3
    )
    assert (rest.requeued, rest.remaining) == (2, 0)
    again = await redrive(
        engine=engine, publisher=None, tenant_id=tenant.id, channel=Channel.sms, match=match
    )
    assert (again.requeued, again.remaining) == (0, 0)


async def test_a_redrive_takes_no_more_than_the_tenants_rule_admits_and_then_is_a_429(
    api: ApiServer, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    """Calls in a loop are charged to the tenant's budget, as its sends are."""
    await _dead(engine, tenant, 8)
    rule = await client.post(
        "/v1/rate-limits", json={"scope": "tenant", "name": "five-a-minute", "limit": 5, "period_s": 60}
    )
    assert rule.status_code == 201, rule.text
    await wait_loaded(api, rule.json())

    first = await client.post("/v1/ops/dlq/sms/redrive", json={})
    assert first.status_code == 200, first.text
    assert (first.json()["requeued"], first.json()["remaining"]) == (5, 3)
    refused = await client.post("/v1/ops/dlq/sms/redrive", json={})
    assert_error(refused, 429, "rate_limited")
    assert 1 <= int(refused.headers["Retry-After"]) <= 12  # one slot of five a minute
    assert refused.json()["error"]["details"]["rule"] == "five-a-minute"
    left = await client.get("/v1/ops/dlq/sms")
    assert len(left.json()["items"]) == 3  # the refused call requeued nothing
