"""Recording webhook calls never deadlocks with another record of the same endpoint, nor with the
tenant disabling or deleting it: each takes the endpoint's row before any of its deliveries'
(``workers/webhook_record.py``, lock order).

Before, a record wrote its own delivery first and the endpoint after. A failure that disabled the
endpoint then parked its pending deliveries (``park_queued``) holding the endpoint, and waited for
a delivery whose record held that delivery and waited for the endpoint: PostgreSQL broke the
deadlock after ``deadlock_timeout`` (1 s), cancelling one record (``until_done`` wrote it again).

Each test makes the interleaving certain: the endpoint's row is held (as another record holds it)
until every writer waits (``pg_locks``), then let go in the order they queued."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any
from uuid import UUID

import asyncpg
import pytest

from api.webhook_endpoints import EndpointPatch, delete_endpoint, update_endpoint
from clarion.pg import create_pool
from core import ssrf
from core.webhook_events import PARKED_AT
from harness.services import drop_database, fresh_database, wait_until
from schema.db import create_engine
from schema.partitions import ensure_ahead
from tests.fixtures.db import LOCK_WAITERS
from workers.webhook_claim import ClaimedDelivery, claim
from workers.webhook_record import RetryPolicy, record_result
from workers.webhook_send import CallResult

POLICY = RetryPolicy(max_attempts=6, base_s=0.2, max_s=0.5, disable_after_failures=3, disable_after_s=60.0)
FAILED = CallResult(ok=False, status=500, error="answered HTTP 500")
OK = CallResult(ok=True, status=204)
# Two failures short of disabling: the next failure (the streak's third) disables the endpoint.
ENDPOINT = """
INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, enabled, secret, failure_streak, failing_since)
VALUES (gen_random_uuid(), 't', 'https://hooks.example.com/', '{notification.sent}', true, 'whsec_x', $1,
        now() - interval '1 hour')
RETURNING id
"""
DELIVERY = """
INSERT INTO webhook_deliveries (id, created_at, endpoint_id, tenant_id, event_id, event_type, body, state)
VALUES (gen_random_uuid(), now(), $1, 't', gen_random_uuid(), 'notification.sent', '{}', 'pending')
"""
HOLD = "SELECT 1 FROM webhook_endpoints WHERE id = $1 FOR NO KEY UPDATE"


@pytest.fixture
async def url() -> AsyncIterator[str]:
    url = await fresh_database("clarion_webhook_locks")
    yield url
    await drop_database(url)


@pytest.fixture
async def pool(url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(url, size=6)
    yield p
    await p.close()


async def _claimed(pool: asyncpg.Pool, *, streak: int) -> tuple[UUID, list[ClaimedDelivery]]:
    """An endpoint with a failure streak of ``streak`` and two of its deliveries, claimed (in flight)."""
    async with pool.acquire() as conn:
        await ensure_ahead(
            conn, parent="webhook_deliveries", today=dt.datetime.now(dt.UTC).date(), days_ahead=1
        )
        await conn.execute("INSERT INTO tenants (id, name) VALUES ('t', 't')")
        endpoint = UUID(str(await conn.fetchval(ENDPOINT, streak)))
        for _ in range(2):
            await conn.execute(DELIVERY, endpoint)
    claimed = await claim(pool=pool, limit=2, lease_s=60, per_tenant=2)
    assert len(claimed) == 2
    return endpoint, claimed


async def _in_order(
    pool: asyncpg.Pool, endpoint: UUID, writers: list[Callable[[], Coroutine[Any, Any, object]]]
) -> list[object]:
    """Run ``writers`` one after another while the endpoint's row is held, each once the one before
    waits for a lock; then let them go. Returns what each returned (or raised)."""
    tasks: list[asyncio.Task[object]] = []
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute(HOLD, endpoint)
        for n, writer in enumerate(writers, start=1):
            tasks.append(asyncio.create_task(writer()))

            async def waiting(n: int = n) -> bool:
                return any(t.done() for t in tasks) or int(await pool.fetchval(LOCK_WAITERS)) >= n

            await wait_until(waiting, 15, 0.01)
            assert not any(t.done() for t in tasks)  # each waits (for the endpoint, or behind it)
    return list(await asyncio.gather(*tasks, return_exceptions=True))


async def _states(pool: asyncpg.Pool) -> list[str]:
    """Each delivery's state, ``pending`` ones ``parked`` or ``due`` (a disabled endpoint's: parked)."""
    rows = await pool.fetch("SELECT state, next_attempt_at FROM webhook_deliveries")
    parked = dt.datetime.fromisoformat(PARKED_AT)
    return sorted(
        r["state"] if r["state"] != "pending" else "parked" if r["next_attempt_at"] >= parked else "due"
        for r in rows
    )


@pytest.mark.parametrize("other", [FAILED, OK], ids=["other_failed", "other_delivered"])
async def test_a_failure_disabling_the_endpoint_and_another_record_of_it_never_deadlock(
    pool: asyncpg.Pool, other: CallResult
) -> None:
    endpoint, (first, second) = await _claimed(pool, streak=POLICY.disable_after_failures - 1)
    results = await _in_order(
        pool,
        endpoint,
        [
            lambda: record_result(pool=pool, delivery=first, result=FAILED, policy=POLICY),
            lambda: record_result(pool=pool, delivery=second, result=other, policy=POLICY),
        ],
    )

    assert results == [True, False]  # the first failure disabled it; neither was cancelled
    assert await pool.fetchval("SELECT enabled FROM webhook_endpoints") is False
    # The call in flight as the endpoint was disabled still counts; what is left waits for it.
    assert await _states(pool) == (["delivered", "parked"] if other.ok else ["parked", "parked"])


@pytest.mark.parametrize("change", ["disable", "delete"])
async def test_a_record_and_the_tenants_disabling_or_deleting_its_endpoint_never_deadlock(
    url: str, pool: asyncpg.Pool, change: str
) -> None:
    endpoint, (first, _) = await _claimed(pool, streak=0)
    engine = create_engine(url)

    async def changed() -> object:
        if change == "delete":
            await delete_endpoint(engine=engine, tenant_id="t", endpoint_id=endpoint)
            return None
        return await update_endpoint(
            engine=engine, tenant_id="t", endpoint_id=endpoint, patch=EndpointPatch(enabled=False),
            allow=ssrf.AllowList.parse([]),
        )  # fmt: skip

    try:
        results = await _in_order(
            pool,
            endpoint,
            [lambda: record_result(pool=pool, delivery=first, result=FAILED, policy=POLICY), changed],
        )
    finally:
        await engine.dispose()

    assert not [r for r in results if isinstance(r, BaseException)]
    assert await _states(pool) == (["cancelled"] * 2 if change == "delete" else ["parked"] * 2)
