"""Scheduled sends coming due for one instant are released at their tenant's rate, and another
tenant's sends due at the same instant do not wait behind them: API -> log -> relay -> Kafka ->
worker -> sandbox, with the relay's pacing (api/release_pacing.py) in between."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from harness.services import api_client, wait_until
from tests.conftest import Stack, TenantInfo, make_tenant
from tests.fixtures.rules import wait_holds
from tests.fixtures.sends import email_send

RULE = {"scope": "tenant", "name": "five-a-second", "limit": 5, "period_s": 1, "burst": 0}
SENDING = sa.text(
    """
    SELECT tenant_id, status, history,
           (SELECT min((e->>'at')::timestamptz) FROM jsonb_array_elements(history) e
             WHERE e->>'status' = 'sending') AS sending_at,
           (SELECT count(*) FROM sandbox_messages s WHERE s.notification_id = n.id) AS messages
      FROM notifications n
     WHERE tenant_id IN (:a, :b)
    """
)


async def schedule(client: httpx.AsyncClient, n: int, send_at: datetime) -> None:
    items = [email_send(send_at=send_at.isoformat()) for _ in range(n)]
    response = await client.post("/v1/notifications/batch", json={"notifications": items})
    assert response.status_code == 202 and response.json()["accepted"] == n, response.text


async def test_a_tenants_sends_due_at_once_go_out_at_its_rate_and_others_do_not_wait(
    stack: Stack, engine: AsyncEngine, client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    due_at = datetime.now(UTC) + timedelta(seconds=8)
    other = await make_tenant(engine)
    async with api_client(stack.api.url, other.key) as other_client:
        await schedule(client, 30, due_at)
        await schedule(other_client, 5, due_at)
    # The rule comes after the accepts (they were all admitted), and the relay holds it before
    # they are due.
    rule = await client.post("/v1/rate-limits", json=RULE)
    assert rule.status_code == 201, rule.text
    await wait_holds(stack.relay.pacing.rules, rule.json()["id"], timeout_s=10)
    assert datetime.now(UTC) < due_at, "the relay took the rule after the sends were due"

    async def all_sent() -> list[Any] | None:
        async with engine.connect() as conn:
            rows = (await conn.execute(SENDING, {"a": tenant.id, "b": other.id})).all()
        return rows if len(rows) == 35 and all(r.status == "sent" for r in rows) else None

    rows = await wait_until(all_sent, timeout_s=45, interval_s=0.5)
    assert all(r.messages == 1 for r in rows)  # each sent once
    mine = sorted(r.sending_at for r in rows if r.tenant_id == tenant.id)
    theirs = sorted(r.sending_at for r in rows if r.tenant_id == other.id)
    # Five at once, then one every 0.2 s: the last of 30 is claimed 5 s after the first.
    assert mine[-1] - mine[0] >= timedelta(seconds=4.5), (mine[0], mine[-1])
    assert sum(t < mine[0] + timedelta(seconds=1) for t in mine) <= 10  # 5 at once + 5 in a second
    assert theirs[-1] < mine[-1] - timedelta(seconds=3)  # released in the first pass
    held = [r for r in rows if r.tenant_id == tenant.id and "five-a-second" in str(r.history)]
    assert len(held) >= 20  # the rows held back say which rule held them
    assert all(str(r.history).count("five-a-second") == 1 for r in held)  # one entry, not one per move


async def test_a_scheduled_send_held_past_the_horizon_after_its_send_at_ends_throttled(
    stack: Stack, engine: AsyncEngine, client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    """A month-old due send whose tenant's rule has no room for it until after the horizon ends
    ``throttled`` naming the rule, so its day of the log is not kept for it (core/horizon.py)."""
    await schedule(client, 2, datetime.now(UTC) + timedelta(days=20))
    rule = await client.post(
        "/v1/rate-limits", json={**RULE, "name": "one-a-minute", "limit": 1, "period_s": 60}
    )
    assert rule.status_code == 201, rule.text
    await wait_holds(stack.relay.pacing.rules, rule.json()["id"], timeout_s=10)
    async with engine.begin() as conn:  # due now, past its horizon: send_at a month and a minute ago
        await conn.execute(
            sa.text(
                "UPDATE notifications SET send_at = now() - interval '30 days 1 minute',"
                " not_before = now() WHERE tenant_id = :t"
            ),
            {"t": tenant.id},
        )

    async def both_final() -> list[Any] | None:
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    sa.text(
                        "SELECT status, error_code, error_message FROM notifications WHERE tenant_id = :t"
                    ),
                    {"t": tenant.id},
                )
            ).all()
        return rows if {r.status for r in rows} <= {"sent", "throttled"} else None

    rows = await wait_until(both_final, timeout_s=30, interval_s=0.3)
    assert sorted(r.status for r in rows) == ["sent", "throttled"]
    [throttled] = [r for r in rows if r.status == "throttled"]
    assert throttled.error_code == "rate_limited" and "one-a-minute" in throttled.error_message
