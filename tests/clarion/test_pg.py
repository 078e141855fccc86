"""The hot-path pools keep finding rows by index as the notification log grows from empty."""

from __future__ import annotations

import datetime as dt

from api.idempotency import EXISTING
from clarion.pg import create_pool
from harness.services import drop_database, fresh_database

TOMORROW = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)


async def test_event_id_lookup_stays_an_index_scan_as_a_young_log_grows() -> None:
    """A connection that ran the repeat lookup while the log was empty still looks event ids up by
    index once the log holds thousands of rows: no plan made for an empty table is kept (that plan
    scanned the whole log on every accept)."""
    url = await fresh_database("clarion_plan")
    pool = await create_pool(url, size=1)
    try:
        async with pool.acquire() as conn:
            await conn.execute("INSERT INTO tenants (id, name) VALUES ('t1', 't1')")
            user_id = await conn.fetchval(
                "INSERT INTO users (id, tenant_id, external_id) VALUES (gen_random_uuid(), 't1', 'u1') RETURNING id"
            )
            for _ in range(8):  # more runs than PostgreSQL needs to settle on a cached generic plan
                assert await conn.fetch(EXISTING, ["t1"], ["e-0"], [], TOMORROW) == []
            await conn.execute(
                """WITH n AS (
                       INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, status)
                       SELECT gen_random_uuid(), 't1', 'e-' || g, 'h', $1, 'email', 'sent'
                         FROM generate_series(1, 5000) g
                       RETURNING id, event_id)
                   INSERT INTO notification_keys
                   SELECT 't1', event_id, (now() AT TIME ZONE 'UTC')::date, id, 'h' FROM n""",
                user_id,
            )
            # Today's keys (the other days' partitions are empty: scanning those costs nothing).
            scans = (
                "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables WHERE relname = "
                "'notification_keys_p' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')"
            )
            async with conn.transaction():  # counts the scans this transaction has made so far
                before = await conn.fetchrow(scans)
                rows = await conn.fetch(EXISTING, ["t1"], ["e-7"], [], TOMORROW)
                after = await conn.fetchrow(scans)
            assert [r["event_id"] for r in rows] == ["e-7"]
            assert after["seq_scan"] == before["seq_scan"], "the lookup scanned the whole log"
            assert after["idx_scan"] > before["idx_scan"]
    finally:
        await pool.close()
        await drop_database(url)
