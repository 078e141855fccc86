"""The webhook tables keep their days: partitions ahead, expired days dropped whole, a day with a
pending delivery of an enabled endpoint kept until it is done, and a disabled endpoint's delivery
still pending past retention cancelled so its day goes, and a call's result recorded while the
upkeep moves its row out of the default partition is kept, as is an endpoint's enabling then."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator
from uuid import UUID

import asyncpg
import pytest

import workers.webhook_delivery
from api.webhook_endpoints import EndpointPatch, update_endpoint
from clarion.pg import create_pool
from clarion.retry_settings import BreakerSettings
from core import ssrf
from core.webhook_events import PARKED_AT
from harness.services import drop_database, fresh_database, wait_until
from schema.db import create_engine
from schema.partitions import ensure_ahead, existing_days
from tests.fixtures.db import LOCK_WAITERS
from workers.webhook_claim import ClaimedDelivery, claim
from workers.webhook_delivery import DeliverySettings, WebhookDeliverer
from workers.webhook_record import RetryPolicy, record_result
from workers.webhook_retention import DAYS_AHEAD, PARENTS, maintain
from workers.webhook_send import CallResult

TODAY = dt.date(2026, 11, 25)
INSERT_DELIVERY = """
INSERT INTO webhook_deliveries (id, created_at, endpoint_id, tenant_id, event_id, event_type, body, state)
VALUES (gen_random_uuid(), $1, coalesce($3, gen_random_uuid()), 't', gen_random_uuid(), 'notification.sent',
        '{}', $2)
"""
INSERT_ENDPOINT = """
INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, enabled, secret)
VALUES (gen_random_uuid(), 't', 'https://hooks.example.com/', '{}', $1, 'whsec_x') RETURNING id
"""


async def _endpoint(conn: asyncpg.Connection, *, enabled: bool) -> UUID:
    await conn.execute("INSERT INTO tenants (id, name) VALUES ('t', 't') ON CONFLICT DO NOTHING")
    return UUID(str(await conn.fetchval(INSERT_ENDPOINT, enabled)))


@pytest.fixture
async def url() -> AsyncIterator[str]:
    url = await fresh_database("clarion_webhook_retention")
    yield url
    await drop_database(url)


@pytest.fixture
async def pool(url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await create_pool(url, size=3)
    yield p
    await p.close()


def _at(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(12), tzinfo=dt.UTC)


async def test_expired_days_go_and_a_day_holding_a_pending_delivery_stays(pool: asyncpg.Pool) -> None:
    old, older = TODAY - dt.timedelta(days=9), TODAY - dt.timedelta(days=10)
    await maintain(pool=pool, today=older, retention_days=7)
    async with pool.acquire() as conn:
        assert len(await existing_days(conn, parent="webhook_deliveries")) == DAYS_AHEAD + 1
        await conn.execute(INSERT_DELIVERY, _at(older), "delivered", None)
        await conn.execute(INSERT_DELIVERY, _at(old), "pending", await _endpoint(conn, enabled=True))
        await conn.execute(
            "INSERT INTO webhook_events (id, created_at, tenant_id, type, occurred_at, body)"
            " VALUES (gen_random_uuid(), $1, 't', 'notification.sent', $1, '{}')",
            _at(older),
        )
    dropped = await maintain(pool=pool, today=TODAY, retention_days=7)
    # Days older..older+3 were made; those before TODAY - 7 go, but for the pending delivery's.
    expired = [
        older + dt.timedelta(days=i)
        for i in range(DAYS_AHEAD + 1)
        if older + dt.timedelta(days=i) < TODAY - dt.timedelta(days=7)
    ]
    expected = [f"webhook_events_p{d:%Y%m%d}" for d in expired]
    expected += [f"webhook_deliveries_p{d:%Y%m%d}" for d in expired if d != old]
    assert sorted(dropped) == sorted(expected) and len(expected) == 5
    async with pool.acquire() as conn:
        days = await existing_days(conn, parent="webhook_deliveries")
        assert old in days and TODAY + dt.timedelta(days=DAYS_AHEAD) in days
        await conn.execute("UPDATE webhook_deliveries SET state = 'delivered'")
    assert await maintain(pool=pool, today=TODAY, retention_days=7) == [f"webhook_deliveries_p{old:%Y%m%d}"]


async def test_a_disabled_endpoints_delivery_still_pending_past_retention_is_cancelled_and_its_day_goes(
    pool: asyncpg.Pool,
) -> None:
    old = TODAY - dt.timedelta(days=9)
    await maintain(pool=pool, today=old, retention_days=7)
    async with pool.acquire() as conn:
        await conn.execute(INSERT_DELIVERY, _at(old), "pending", await _endpoint(conn, enabled=False))
        await conn.execute(INSERT_DELIVERY, _at(TODAY), "pending", await _endpoint(conn, enabled=False))
    dropped = await maintain(pool=pool, today=TODAY, retention_days=7)
    assert f"webhook_deliveries_p{old:%Y%m%d}" in dropped
    async with pool.acquire() as conn:
        rows = await conn.fetch("SELECT created_at, state FROM webhook_deliveries")
    assert [(r["created_at"].date(), r["state"]) for r in rows] == [
        (TODAY, "pending")
    ]  # within retention: waits


POLICY = RetryPolicy(
    max_attempts=6, base_s=0.2, max_s=0.5, disable_after_failures=1000, disable_after_s=3600.0
)


@pytest.mark.parametrize(
    ("result", "recorded"),
    [
        (CallResult(ok=True, status=204), ("delivered", 204)),
        (CallResult(ok=False, status=500, error="answered HTTP 500"), ("pending", 500)),
    ],
)
async def test_a_result_recorded_while_the_upkeep_moves_its_row_out_of_the_default_partition_is_kept(
    pool: asyncpg.Pool, result: CallResult, recorded: tuple[str, int]
) -> None:
    """A day without its partition (a fresh database, upkeep behind) queues into
    ``webhook_deliveries_default``; the upkeep creating the day moves its rows out (delete, insert,
    attach) under an ACCESS EXCLUSIVE lock on the default partition. A record waiting on that lock
    then ran against the deleted row: UPDATE 0, the call that happened unrecorded, the delivery
    pending until its lease ended and sent again (the two notification.sent of a CI run)."""
    async with pool.acquire() as conn:
        await conn.execute(INSERT_DELIVERY, _at(TODAY), "pending", await _endpoint(conn, enabled=True))
        assert await conn.fetchval("SELECT tableoid::regclass::text FROM webhook_deliveries") == (
            "webhook_deliveries_default"
        )
    [delivery] = await claim(pool=pool, limit=1, lease_s=60, per_tenant=1)
    async with pool.acquire() as mover, mover.transaction():
        await ensure_ahead(mover, parent="webhook_deliveries", today=TODAY, days_ahead=0)
        record = asyncio.create_task(
            record_result(pool=pool, delivery=delivery, result=result, policy=POLICY)
        )

        async def waiting() -> bool:
            return record.done() or bool(await pool.fetchval(LOCK_WAITERS))

        await wait_until(waiting, 15, 0.01)
        assert not record.done()  # it waits for the move
    await record
    row = await pool.fetchrow("SELECT tableoid::regclass::text AS part, * FROM webhook_deliveries")
    assert row is not None
    assert (row["part"], row["attempts"]) == (f"webhook_deliveries_p{TODAY:%Y%m%d}", 1)
    assert (row["state"], row["last_status"]) == recorded


async def test_an_endpoint_enabled_while_the_upkeep_moves_its_parked_deliveries_gets_them_back(
    url: str, pool: asyncpg.Pool
) -> None:
    """The same move beside a tenant enabling its endpoint: the unpark that waited for it was
    planned before the day was attached, and left the moved deliveries parked for good."""
    async with pool.acquire() as conn:
        endpoint = await _endpoint(conn, enabled=False)
        await conn.execute(INSERT_DELIVERY, _at(TODAY), "pending", endpoint)
        await conn.execute(f"UPDATE webhook_deliveries SET next_attempt_at = '{PARKED_AT}'")
    engine = create_engine(url)
    try:
        async with pool.acquire() as mover, mover.transaction():
            await ensure_ahead(mover, parent="webhook_deliveries", today=TODAY, days_ahead=0)
            enable = asyncio.create_task(
                update_endpoint(
                    engine=engine,
                    tenant_id="t",
                    endpoint_id=endpoint,
                    patch=EndpointPatch(enabled=True),
                    allow=ssrf.AllowList.parse([]),
                )
            )

            async def waiting() -> bool:
                return enable.done() or bool(await pool.fetchval(LOCK_WAITERS))

            await wait_until(waiting, 15, 0.01)
            assert not enable.done()  # it waits for the move
        assert (await enable).enabled
    finally:
        await engine.dispose()
    row = await pool.fetchrow(
        "SELECT tableoid::regclass::text AS part, next_attempt_at FROM webhook_deliveries"
    )
    assert row is not None and row["part"] == f"webhook_deliveries_p{TODAY:%Y%m%d}"
    assert row["next_attempt_at"] < dt.datetime(9999, 1, 1, tzinfo=dt.UTC)  # due, no longer parked


async def test_clarion_webhooks_makes_today_and_tomorrow_before_its_first_claim(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh install has only the webhook tables' default partitions (migration 0008). Before,
    the process's first upkeep ran beside its first claims: what was queued meanwhile went into
    the defaults, and making the day moved it under the claims and records (the two tests above)."""
    days_at_first_claim: dict[str, list[dt.date]] = {}
    claimed = asyncio.Event()

    async def first_claim(**_: object) -> list[ClaimedDelivery]:
        if not claimed.is_set():
            async with pool.acquire() as conn:
                for parent in PARENTS:
                    days_at_first_claim[parent] = await existing_days(conn, parent=parent)
            claimed.set()
        return []

    monkeypatch.setattr(workers.webhook_delivery, "claim", first_claim)
    today = dt.datetime.now(dt.UTC).date()
    settings = DeliverySettings(
        concurrency=1, per_tenant=1, lease_s=60.0, timeout_s=1.0, poll_interval_s=0.05, retention_days=7,
        allow=ssrf.AllowList.parse([]), policy=POLICY, breaker=BreakerSettings(enabled=False),
    )  # fmt: skip
    deliverer = WebhookDeliverer(pool=pool, settings=settings)
    run = asyncio.create_task(deliverer.run())
    try:
        await asyncio.wait_for(claimed.wait(), 30)
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
    tomorrow = today + dt.timedelta(days=1)
    assert days_at_first_claim == {parent: [today, tomorrow] for parent in PARENTS}
