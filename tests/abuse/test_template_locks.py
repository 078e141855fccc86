"""A template's lock (``api/templates_service.py``) is held only for a few cheap statements, so the
requests of one tenant queued on it never hold the API's pooled connections for long.

Each waiter holds one of the API's pooled connections. Before, a tenant made the holder slow at
will: each new version rewrote every version of its template (40 creates of one template at once,
a helper's probe: another tenant's ``PUT /v1/users`` p99 1.1-1.3 s against 0.2-0.3 s under as many
creates of distinct templates), and an activation rendered while holding it, after waiting up to
3 s for the tenant's render turn."""

from __future__ import annotations

import asyncio

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from harness.services import ApiServer, wait_until
from tests.conftest import TenantInfo
from tests.fixtures.render_turn import turn_held

TEMPLATE = {
    "name": "receipt",
    "channel": "sms",
    "locale": "en",
    "body": "Paid {{ n }}",
    "sample_data": {"n": 1},
}


async def _row_versions(engine: AsyncEngine, tenant_id: str) -> dict[int, str]:
    """Each version's row version (``xmin``: it changes when the row is rewritten)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text("SELECT version, xmin::text FROM templates WHERE tenant_id = :t AND name = 'receipt'"),
            {"t": tenant_id},
        )
        return {r.version: r.xmin for r in rows}


async def test_a_new_version_rewrites_only_the_active_one(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    for _ in range(5):
        assert (await client.post("/v1/templates", json=TEMPLATE)).status_code == 201
    before = await _row_versions(engine, tenant.id)
    created = await client.post("/v1/templates", json=TEMPLATE)
    assert created.status_code == 201 and created.json()["version"] == 6, created.text
    after = await _row_versions(engine, tenant.id)
    assert [v for v in before if after[v] != before[v]] == [5], "only the version active before was rewritten"
    activated = await client.post(
        "/v1/templates/receipt/activate", json={"channel": "sms", "locale": "en", "version": 2}
    )
    assert activated.status_code == 200 and activated.json()["active"] is True, activated.text
    last = await _row_versions(engine, tenant.id)
    assert sorted(v for v in after if last[v] != after[v]) == [2, 6], "only the two versions that changed"
    listed = (await client.get("/v1/templates/receipt")).json()
    assert [t["version"] for t in listed if t["active"]] == [2]


async def _idle_in_transaction(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        found = await conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
            )
        )
        return int(found.scalar_one())


async def _template_lock_free(engine: AsyncEngine, tenant_id: str) -> bool:
    """Whether the test can take the template's lock (``api/caps.py`` keys it so) at once."""
    async with engine.begin() as conn:
        took = await conn.execute(
            sa.text("SELECT pg_try_advisory_xact_lock(hashtextextended(:k, 0))"),
            {"k": f"template:{tenant_id}:receipt:sms:en"},
        )
        return bool(took.scalar_one())


async def test_an_activation_waiting_for_its_render_holds_no_lock_nor_connection(
    api: ApiServer, client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    for _ in range(2):
        assert (await client.post("/v1/templates", json=TEMPLATE)).status_code == 201
    renderer = api.app.state.renderer
    turns = renderer.turns._turns  # how many renders of the tenant wait for its turn
    async with turn_held(renderer, tenant.id) as release:  # as another render of the tenant's in flight
        activation = asyncio.create_task(
            client.post(
                "/v1/templates/receipt/activate", json={"channel": "sms", "locale": "en", "version": 1}
            )
        )
        await wait_until(lambda: tenant.id in turns and turns[tenant.id].waiting == 2, 5, 0.01)
        assert await _template_lock_free(engine, tenant.id), "the activation holds the template's lock"
        assert await _idle_in_transaction(engine) == 0, "the activation holds a transaction open"
        release.set()
        answer = await activation
    assert answer.status_code == 200 and answer.json()["version"] == 1, answer.text
