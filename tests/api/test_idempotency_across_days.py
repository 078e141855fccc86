"""An event id stays unique across the log's daily partitions: a first use committed by a
transaction of yesterday (just before midnight) while today's send of the same id waits on its
key's lock makes that send a repeat, though neither the key's primary key (it names the day) nor
the waiting send's first lookup (its snapshot predates the commit) can see it."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets

import asyncpg
import httpx

from api.idempotency import key_locks
from clarion.pg import asyncpg_dsn
from harness.services import wait_until
from harness.tenants import TenantInfo
from schema.ids import uuid7_at
from schema.partitions import ensure_ahead
from tests.fixtures.sends import email_send

WAITING_ON_A_KEY = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def test_a_first_use_committed_just_before_midnight_makes_a_waiting_send_a_repeat(
    client: httpx.AsyncClient, tenant: TenantInfo, database_url: str
) -> None:
    created = await client.post("/v1/notifications", json=email_send())  # the user u-1
    assert created.status_code == 202, created.text
    today = dt.datetime.now(dt.UTC).date()
    yesterday = today - dt.timedelta(days=1)
    before_midnight = dt.datetime.combine(today, dt.time(), dt.UTC) - dt.timedelta(milliseconds=100)
    event_id = f"evt-{secrets.token_hex(6)}"
    first = uuid7_at(before_midnight)
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        for table in ("notifications", "notification_keys"):
            await ensure_ahead(conn, parent=table, today=yesterday, days_ahead=0)
        user_id = await conn.fetchval(
            "SELECT id FROM users WHERE tenant_id = $1 AND external_id = 'u-1'", tenant.id
        )
        first_use = conn.transaction()
        await first_use.start()
        # What the accept path of a transaction that began at 23:59:59.9 holds and writes.
        await conn.execute("SELECT pg_advisory_xact_lock($1)", key_locks([(tenant.id, event_id)])[0])
        await conn.execute(
            "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, status,"
            " history, created_at, updated_at) VALUES ($1, $2, $3, 'other', $4, 'email', 'sent',"
            " $5::jsonb, $6, $6)",
            first, tenant.id, event_id, user_id, json.dumps([]), before_midnight,
        )  # fmt: skip
        await conn.execute(
            "INSERT INTO notification_keys VALUES ($1, $2, $3, $4, 'other')",
            tenant.id,
            event_id,
            yesterday,
            first,
        )
        waiting = asyncio.create_task(client.post("/v1/notifications", json=email_send(event_id=event_id)))
        await wait_until(lambda: conn.fetchval(WAITING_ON_A_KEY))
        await first_use.commit()
        repeat = await waiting
    finally:
        await conn.close()
    assert repeat.status_code == 409, repeat.text
    assert repeat.json()["error"]["details"]["id"] == str(first)
    listed = await client.get("/v1/notifications", params={"limit": 100})
    assert [n["id"] for n in listed.json()["items"] if n["event_id"] == event_id] == [str(first)]
