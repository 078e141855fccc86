"""A webhook endpoint for a bench tenant, so each send also logs an event and queues a delivery.

The endpoint subscribes to ``notification.sent`` and ``.failed``: the worker's record step then
writes a webhook event and a delivery per outcome (``core.webhook_events.enqueue_events``), which
is the cost a bench run with it measures. No ``clarion webhooks`` process runs beside the bench, so
the deliveries stay pending and nothing is called; its address, the discard port on 127.0.0.1, is
written directly, without the API's check of the address (an operator allow-list would be needed).
"""

from __future__ import annotations

import asyncpg

from clarion.pg import asyncpg_dsn
from harness.tenants import TenantInfo

ENDPOINT = """
INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, secret)
VALUES (gen_random_uuid(), $1, 'http://127.0.0.1:9/bench', ARRAY['notification.sent', 'notification.failed'],
        'whsec_YmVuY2hiZW5jaGJlbmNoYmVuY2g=')
"""


async def add_webhook_endpoint(url: str, tenant: TenantInfo) -> None:
    """A ``bench.e2e.pipeline`` ``prepare``: the tenant's endpoint, before the processes start."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await conn.execute(ENDPOINT, tenant.id)
    finally:
        await conn.close()


async def queued_deliveries(url: str) -> int:
    """Deliveries queued so far, to every endpoint (the proof that the run queued them)."""
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        return int(await conn.fetchval("SELECT count(*) FROM webhook_deliveries"))
    finally:
        await conn.close()
