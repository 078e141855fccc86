"""Event-id idempotency: an ``event_id`` is accepted once per tenant, across the log's days.

The log is partitioned by day, so no unique index can span it: each first use is a row of
``notification_keys`` (partitioned by the week of that use), looked up over every week still kept.
A repeat with the same body answers ``200`` with the first notification (``duplicate``); with a
different body, ``409 event_id_conflict``. A repeat is recognised while its week's partition exists:
until ``CLARION_RETENTION_DAYS`` whole days after the week's last day (README).

Concurrent first uses are serialised by one transaction-scoped advisory lock per key, taken in
sorted order by a transaction's first lookup; ``api.accept``'s INSERT then writes the key with
``ON CONFLICT DO NOTHING`` (a first use of the same day) and only if no key of yesterday is there
(a transaction begun before midnight), so the loser is answered as a repeat of the winner.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from uuid import UUID

import asyncpg

from api.errors import ApiError
from api.submission import AcceptDecision, AcceptResult, Submission
from schema.ids import created_window

# Every kept week's keys (one index probe per partition). The advisory locks are a one-time filter,
# evaluated before the scan whatever it finds; the scan's snapshot may predate a commit the lock
# waited for, which is why api.accept's INSERT, a later statement, checks again. ``$4`` (tomorrow
# by this process's clock, a day of slack for a database clock ahead of it) lets the planner leave
# the days created ahead out of the plan: planning every partition was most of the lookup's cost.
# One probe per key (LATERAL): a young day's partition, its statistics not yet gathered, looks
# small to the planner, which then hashed a sequential scan of all of it on every accept.
EXISTING = """
SELECT q.tenant_id, q.event_id, k.notification_id AS id, k.request_hash
  FROM unnest($1::text[], $2::text[]) AS q(tenant_id, event_id)
 CROSS JOIN LATERAL (
       SELECT k.notification_id, k.request_hash FROM notification_keys k
        WHERE k.tenant_id = q.tenant_id AND k.event_id = q.event_id AND k.day <= $4::date
        LIMIT 1) AS k
 WHERE (SELECT count(pg_advisory_xact_lock(h)) FROM unnest($3::bigint[]) AS h) >= 0
"""
# Only for repeats (rare): their first notification's status, in the days their ids name.
STATUSES = """
SELECT id, status FROM notifications WHERE id = ANY($1::uuid[]) AND created_at BETWEEN $2 AND $3
"""


@dataclass(frozen=True, slots=True)
class FirstUse:
    """The notification an event id was first used for."""

    id: UUID
    request_hash: str
    status: str


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
) -> dict[tuple[str, str], FirstUse]:
    """The first use of each send's event id that is still kept, by (tenant, event id)."""
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    rows = await conn.fetch(
        EXISTING, [s.principal.tenant_id for s in sends], [s.req.event_id for s in sends], locks, tomorrow
    )
    if not rows:
        return {}
    ids = [r["id"] for r in rows]
    statuses = {r["id"]: r["status"] for r in await conn.fetch(STATUSES, ids, *created_window(ids))}
    # ``expired`` when retention dropped the notification's day and its key's week is still kept
    # (a key outlives its notification by up to 6 days, clarion.log_maintenance.KEY_SPAN_DAYS):
    # still a repeat, of a notification no longer kept.
    return {
        (r["tenant_id"], r["event_id"]): FirstUse(
            r["id"], r["request_hash"], statuses.get(r["id"], "expired")
        )
        for r in rows
    }


def repeat_of(first: FirstUse, send: Submission) -> AcceptDecision:
    """A ``duplicate`` answer with the first notification, or 409 for a different body."""
    if first.request_hash != send.digest:
        return ApiError(
            409,
            "event_id_conflict",
            f"event_id '{send.req.event_id}' was already used for a different notification.",
            {"id": str(first.id)},
        )
    return AcceptResult(first.id, first.status, True, None)
