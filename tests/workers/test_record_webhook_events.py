"""The record step emits a webhook event exactly for the outcomes it stored: sent and the terminal
failures, never a waiting state, never an outcome it refused (a notification no longer sending)."""

from __future__ import annotations

from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.pg import create_pool
from clarion.settings import Settings
from harness.tenants import TenantInfo, make_tenant
from schema.enums import Status
from schema.ids import uuid7
from tests.fixtures.hooks import sent_notification
from workers.outcome import Outcome
from workers.record import record_outcomes


async def _sending(engine: AsyncEngine, tenant: TenantInfo) -> str:
    nid, _ = await sent_notification(engine, tenant, channel="email")
    async with engine.begin() as conn:
        await conn.execute(sa.text("UPDATE notifications SET status = 'sending' WHERE id = :n"), {"n": nid})
    return nid


async def _endpoint(engine: AsyncEngine, tenant_id: str, types: list[str]) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, secret)"
                " VALUES (:i, :t, 'http://127.0.0.1:9/', :types, 'whsec_AAAA')"
            ),
            {"i": uuid7(), "t": tenant_id, "types": types},
        )


async def _logged(engine: AsyncEngine, tenant_id: str) -> list[tuple[str, str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text(
                "SELECT e.type, e.notification_id::text, e.body FROM webhook_events e"
                " WHERE e.tenant_id = :t ORDER BY e.notification_id"
            ),
            {"t": tenant_id},
        )
        return [(r[0], r[1], r[2]) for r in rows]


async def test_stored_outcomes_are_events_and_refused_or_waiting_ones_are_not(
    settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    await _endpoint(engine, tenant.id, ["notification.sent"])  # subscribes to sent only
    failed, sent, retrying = [await _sending(engine, tenant) for _ in range(3)]
    already_sent, _ = await sent_notification(engine, tenant, channel="email")  # not sending: refused
    outcomes = [
        Outcome(notification_id=_uuid(failed), status=Status.failed, error_code="invalid_address"),
        Outcome(notification_id=_uuid(sent), status=Status.sent, provider="sandbox"),
        Outcome(notification_id=_uuid(retrying), status=Status.retrying),
        Outcome(notification_id=_uuid(already_sent), status=Status.failed),
    ]
    pool = await create_pool(settings.database_url, size=1)
    try:
        await record_outcomes(pool=pool, outcomes=outcomes)
    finally:
        await pool.close()
    logged = await _logged(engine, tenant.id)
    assert sorted((t, n) for t, n, _ in logged) == sorted(
        [("notification.failed", failed), ("notification.sent", sent)]
    )
    assert '"error_code":"invalid_address"' in next(b for t, _, b in logged if t == "notification.failed")
    async with engine.connect() as conn:
        queued = (
            (
                await conn.execute(
                    sa.text("SELECT event_type FROM webhook_deliveries WHERE tenant_id = :t"),
                    {"t": tenant.id},
                )
            )
            .scalars()
            .all()
        )
    assert queued == ["notification.sent"]  # the endpoint subscribes to sent only


async def test_a_tenant_without_endpoints_gets_no_event_rows(settings: Settings, engine: AsyncEngine) -> None:
    tenant = await make_tenant(engine)
    nid = await _sending(engine, tenant)
    pool = await create_pool(settings.database_url, size=1)
    try:
        await record_outcomes(pool=pool, outcomes=[Outcome(notification_id=_uuid(nid), status=Status.sent)])
    finally:
        await pool.close()
    assert await _logged(engine, tenant.id) == []


async def test_one_batch_of_two_tenants_logs_events_for_the_one_with_an_endpoint(
    settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    await _endpoint(engine, tenant.id, ["notification.sent"])
    quiet = await make_tenant(engine)
    hooked, unhooked = await _sending(engine, tenant), await _sending(engine, quiet)
    pool = await create_pool(settings.database_url, size=1)
    try:
        await record_outcomes(
            pool=pool,
            outcomes=[
                Outcome(notification_id=_uuid(n), status=Status.sent, provider="sandbox")
                for n in (unhooked, hooked)
            ],
        )
    finally:
        await pool.close()
    assert [(t, n) for t, n, _ in await _logged(engine, tenant.id)] == [("notification.sent", hooked)]
    assert await _logged(engine, quiet.id) == []


def _uuid(text: str) -> UUID:
    return UUID(text)
