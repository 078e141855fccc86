"""What two of this round's fairness guards cost PostgreSQL, each against what it replaced.

    .venv/bin/python -m bench.contention [--log-rows 200000] [--backlog 100000] [--rounds 400]

On a fresh database (dropped afterwards):

- **The outbox's mark** (``api/outbox.py`` ``MARK_PUBLISHED``). It now locks with ``SKIP LOCKED``,
  so it never waits on, or deadlocks with, a worker's claim or record. It runs against
  ``--log-rows`` accepted notifications, with batches of 50 and of 10 ids, alternating with the
  plain ``UPDATE`` it replaced. It prints the time per batch and per id.
- **The webhook claim** (``workers/webhook_claim.py``), with one tenant ``--backlog`` due
  deliveries deep and another tenant holding 10. It times the claim of 32 in four cases: the
  tenant not at its share (``CLAIM``, which takes its 4), the tenant at its share (``CLAIM_PAST_FULL``
  walks the tenants and takes the other's 4), the same with ``CLAIM``, which reads past the
  backlog to take them, and the claim before shares for comparison. Each
  claim runs in a transaction that is rolled back, so every round sees the same rows.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import time
from typing import Any

import asyncpg

from api.outbox import MARK_PUBLISHED
from clarion.log_maintenance import maintain
from clarion.pg import asyncpg_dsn
from harness.services import drop_database, fresh_database
from schema.ids import created_window, uuid7
from workers.webhook_claim import CLAIM, CLAIM_PAST_FULL

# What each guard replaced, kept here only to be measured against.
PLAIN_MARK = """
    UPDATE notifications
       SET published_at = now(),
           queued_at = CASE WHEN status = 'accepted' THEN coalesce(queued_at, now()) ELSE queued_at END
     WHERE id = ANY($1::uuid[]) AND created_at BETWEEN $2 AND $3
"""
CLAIM_BEFORE_SHARES = """
WITH due AS (
    SELECT d.id, d.created_at FROM webhook_deliveries d
     WHERE d.state = 'pending' AND d.next_attempt_at <= now()
       AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = d.endpoint_id AND e.enabled)
     ORDER BY d.next_attempt_at
     LIMIT $1
       FOR UPDATE OF d SKIP LOCKED
)
SELECT d.tenant_id FROM webhook_deliveries d JOIN due ON d.id = due.id AND d.created_at = due.created_at
"""
ACCEPTED = """
INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, category, priority,
                           status, history, attempts, claims, created_at, updated_at)
SELECT i, 't', i::text, 'h', gen_random_uuid(), 'email', 'c', 'normal', 'accepted', '[]'::jsonb, 0, 0,
       now(), now()
  FROM unnest($1::uuid[]) i
"""
DELIVERIES = """
INSERT INTO webhook_deliveries (id, created_at, endpoint_id, tenant_id, event_id, event_type, body, state,
                                attempts, next_attempt_at, replay)
SELECT gen_random_uuid(), now() - $4::interval, $1, $2, gen_random_uuid(), 't', '{}', 'pending', 0,
       now() - $4::interval + i * interval '1 ms', false
  FROM generate_series(1, $3) i
"""


async def _marks(conn: asyncpg.Connection, *, rows: int, rounds: int) -> None:
    ids = [uuid7() for _ in range(rows)]
    await conn.execute(ACCEPTED, ids)
    await conn.execute("VACUUM ANALYZE notifications")
    for size in (50, 10):
        spent = {"plain UPDATE (before)": 0.0, "SKIP LOCKED (now)": 0.0}
        statements = list(zip(spent, (PLAIN_MARK, MARK_PUBLISHED), strict=True))
        for r in range(rounds):
            for name, sql in statements if r % 2 else reversed(statements):
                start = (r * 7919 + len(name) * 104729) % (rows - size)
                batch = ids[start : start + size]
                t = time.perf_counter()
                await conn.execute(sql, batch, *created_window(batch))
                spent[name] += time.perf_counter() - t
        for name, total in spent.items():
            per_batch = total / rounds
            print(
                f"mark, batches of {size:>2}, {name:<22} {per_batch * 1e3:7.3f} ms  {per_batch / size * 1e6:6.1f} us per id"
            )


async def _claims(conn: asyncpg.Connection, *, backlog: int, rounds: int) -> None:
    await conn.execute("INSERT INTO tenants (id, name) VALUES ('a', 'a'), ('b', 'b')")
    endpoints = {}
    for tenant in ("a", "b"):
        endpoints[tenant] = await conn.fetchval(
            "INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, enabled, secret)"
            " VALUES ($1, $2, 'https://hooks.example.com/', '{}', true, 'whsec_x') RETURNING id",
            uuid7(),
            tenant,
        )
    await conn.execute(DELIVERIES, endpoints["a"], "a", backlog, dt.timedelta(hours=1))
    await conn.execute(DELIVERIES, endpoints["b"], "b", 10, dt.timedelta(minutes=1))
    await conn.execute("VACUUM ANALYZE webhook_deliveries")
    cases: list[tuple[str, str, tuple[Any, ...]]] = [
        ("before shares", CLAIM_BEFORE_SHARES, (32,)),
        ("a below its share", CLAIM, (32, 120.0, [], 4, [], [])),
        ("a at its share", CLAIM_PAST_FULL, (32, 120.0, ["a"], 4, ["a"], [4])),
        ("a at its share, read past", CLAIM, (32, 120.0, ["a"], 4, ["a"], [4])),
    ]
    for name, sql, args in cases:
        times, taken = [], ""
        for _ in range(rounds):
            transaction = conn.transaction()
            await transaction.start()
            t = time.perf_counter()
            rows = await conn.fetch(sql, *args)
            times.append(time.perf_counter() - t)
            await transaction.rollback()
            counts: dict[str, int] = {}
            for row in rows:
                counts[row["tenant_id"]] = counts.get(row["tenant_id"], 0) + 1
            taken = ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))
        print(
            f"webhook claim of 32, {name:<18} median {statistics.median(times) * 1e3:6.2f} ms, "
            f"max {max(times) * 1e3:6.2f} ms; took {taken}"
        )


async def main(*, log_rows: int, backlog: int, rounds: int) -> None:
    url = await fresh_database("clarion_bench_contention")
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        yesterday = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)
        await maintain(conn=conn, today=yesterday, retention_days=30, partitions_ahead=3)
        print(f"{log_rows:,} accepted notifications; tenant a {backlog:,} due webhook deliveries deep")
        await _marks(conn, rows=log_rows, rounds=rounds)
        await _claims(conn, backlog=backlog, rounds=max(rounds // 20, 5))
    finally:
        await conn.close()
        await drop_database(url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log-rows", type=int, default=200_000)
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()
    asyncio.run(main(log_rows=args.log_rows, backlog=args.backlog, rounds=args.rounds))
