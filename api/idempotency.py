"""Event-id idempotency: an ``event_id`` is accepted once per tenant, across the log's days.

The log is partitioned by day, so no unique index can span it: each first use is a row of
``notification_keys`` (partitioned by the day of that use), looked up over every day still kept.
A repeat with the same body answers ``200`` with the first notification (``duplicate``); with a
different body, ``409 event_id_conflict``. A repeat is recognised while its day's partition exists:
``CLARION_RETENTION_DAYS`` whole days after that day (README).

Concurrent first uses are serialised by one transaction-scoped advisory lock per key, taken in
sorted order by a transaction's first lookup; ``api.accept``'s INSERT then writes the key with
``ON CONFLICT DO NOTHING`` (a first use of the same day) and ``NOT EXISTS`` one of yesterday (a
transaction begun before midnight), so the loser is answered as a repeat of the winner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import asyncpg

from api.errors import ApiError
from api.submission import AcceptDecision, AcceptResult, Submission

# Every kept day's keys (one index probe per partition). The advisory locks are a one-time filter,
# evaluated before the scan whatever it finds; the scan's snapshot may predate a commit the lock
# waited for, which is why api.accept's INSERT, a later statement, checks again.
# A key's notification is in its key's day (one partition); ``expired`` only if retention dropped
# that day first, which the loop's order (keys before notifications) rules out.
EXISTING = """
SELECT k.tenant_id, k.event_id, k.notification_id AS id, k.request_hash,
       coalesce((SELECT n.status FROM notifications n
                  WHERE n.id = k.notification_id
                    AND n.created_at >= k.day::timestamp AT TIME ZONE 'UTC'
                    AND n.created_at < (k.day + 1)::timestamp AT TIME ZONE 'UTC'), 'expired') AS status
  FROM notification_keys k
  JOIN unnest($1::text[], $2::text[]) AS q(tenant_id, event_id)
    ON k.tenant_id = q.tenant_id AND k.event_id = q.event_id
 WHERE (SELECT count(pg_advisory_xact_lock(h)) FROM unnest($3::bigint[]) AS h) >= 0
"""


def key_locks(keys: Iterable[tuple[str, str]]) -> list[int]:
    """One advisory lock id per distinct (tenant, event id), sorted: every transaction takes its
    locks in the same order, so two never wait on each other in a cycle."""
    return sorted(
        {
            int.from_bytes(
                hashlib.blake2b(f"event\0{t}\0{e}".encode(), digest_size=8).digest(), "big", signed=True
            )
            for t, e in keys
        }
    )


async def not_repeats(
    conn: asyncpg.Connection,
    sends: Sequence[Submission],
    batch: list[int],
    decisions: list[AcceptDecision | None],
    locks: list[int],
) -> list[int]:
    """Decide the sends whose event id was used before; return the others."""
    seen = await existing_keys(conn, [sends[i] for i in batch], locks)
    fresh = []
    for i in batch:
        row = seen.get(sends[i].event_key)
        if row is None:
            fresh.append(i)
        else:
            decisions[i] = repeat_of(row, sends[i])
    return fresh


async def existing_keys(
    conn: asyncpg.Connection, sends: list[Submission], locks: list[int]
) -> dict[tuple[str, str], asyncpg.Record]:
    rows = await conn.fetch(
        EXISTING, [s.principal.tenant_id for s in sends], [s.req.event_id for s in sends], locks
    )
    return {(r["tenant_id"], r["event_id"]): r for r in rows}


def repeat_of(row: asyncpg.Record, send: Submission) -> AcceptDecision:
    if row["request_hash"] != send.digest:
        return ApiError(
            409,
            "event_id_conflict",
            f"event_id '{send.req.event_id}' was already used for a different notification.",
            {"id": str(row["id"])},
        )
    return AcceptResult(row["id"], row["status"], True, None)
