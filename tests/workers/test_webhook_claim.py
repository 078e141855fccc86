"""``workers.webhook_claim.claim`` on a database of its own (the claim takes any tenant's due
deliveries, so the session's shared database would lend it other tests' rows): with a tenant at
its share, the claim walks the other tenants (``CLAIM_PAST_FULL``) and takes from each at most what
it has left of its share, oldest first, as the claim without a full tenant does."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import asyncpg
import pytest

from clarion.pg import asyncpg_dsn
from harness.services import drop_database, fresh_database
from schema.ids import uuid7
from workers.webhook_claim import claim

DELIVERIES = """
INSERT INTO webhook_deliveries (id, created_at, endpoint_id, tenant_id, event_id, event_type, body, state,
                                attempts, next_attempt_at, replay)
SELECT gen_random_uuid(), now(), $1, $2, gen_random_uuid(), 't', '{}', 'pending', 0,
       now() + $4::interval + i * interval '1 ms', false
  FROM generate_series(1, $3) i
"""
AGO = dt.timedelta(minutes=-10)


@pytest.fixture
async def pool() -> AsyncIterator[asyncpg.Pool]:
    url = await fresh_database("clarion_webhook_claim")
    pool = await asyncpg.create_pool(asyncpg_dsn(url), min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()
        await drop_database(url)


async def deliveries(
    pool: asyncpg.Pool, tenant: str, n: int, *, due_in: dt.timedelta, enabled: bool = True
) -> None:
    await pool.execute("INSERT INTO tenants (id, name) VALUES ($1, $1) ON CONFLICT DO NOTHING", tenant)
    endpoint = await pool.fetchval(
        "INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, enabled, secret)"
        " VALUES ($1, $2, 'https://hooks.example.com/', '{}', $3, 'whsec_x') RETURNING id",
        uuid7(),
        tenant,
        enabled,
    )
    await pool.execute(DELIVERIES, endpoint, tenant, n, due_in)


async def test_a_tenant_at_its_share_is_walked_past_and_each_other_takes_what_it_has_left(
    pool: asyncpg.Pool,
) -> None:
    await deliveries(pool, "a", 500, due_in=AGO * 2)  # the oldest, and at its share
    await deliveries(pool, "b", 6, due_in=AGO)  # 3 calls in flight: 1 left of 4
    await deliveries(pool, "c", 6, due_in=AGO + dt.timedelta(seconds=1))
    await deliveries(pool, "d", 6, due_in=AGO, enabled=False)  # its endpoint disabled
    await deliveries(pool, "e", 6, due_in=dt.timedelta(minutes=5))  # not yet due

    claimed = await claim(pool=pool, limit=32, lease_s=60, per_tenant=4, busy={"a": 4, "b": 3})

    assert [d.tenant_id for d in claimed].count("b") == 1
    assert sorted(d.tenant_id for d in claimed) == ["b", "c", "c", "c", "c"]
    again = await claim(pool=pool, limit=32, lease_s=60, per_tenant=4, busy={"a": 4, "b": 4, "c": 4})
    assert again == []  # what was claimed is leased; the rest is a's, b's and c's at their shares


async def test_the_claim_of_a_few_takes_the_oldest_due_of_the_other_tenants(pool: asyncpg.Pool) -> None:
    await deliveries(pool, "a", 50, due_in=AGO * 3)
    for i, tenant in enumerate(("b", "c", "d", "e")):
        await deliveries(pool, tenant, 2, due_in=AGO + dt.timedelta(seconds=i))

    claimed = await claim(pool=pool, limit=3, lease_s=60, per_tenant=4, busy={"a": 4})

    assert sorted(d.tenant_id for d in claimed) == ["b", "b", "c"]  # the three oldest past a's
