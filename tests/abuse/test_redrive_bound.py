"""A tenant's redrive requeues at most ``MAX_REDRIVE_PER_CALL`` dead letters and says how many
still match (``api/dlq.py``): a redrive puts them into the lane every tenant shares, past the
API's ingress limits, so one call must not queue a million ahead of everyone else's sends."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.dlq import RedriveFilter, redrive
from harness.tenants import TenantInfo
from schema.enums import Channel
from tests.fixtures.hooks import sent_notification


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
