"""The events a tenant's webhook endpoints receive, and the one way to emit them.

Emitted by the worker's record step (``sent``, ``failed``: ``workers.record``) and by
``core.engagement.record_engagement`` (each counted report: ``delivered``, ``opened``...).
``enqueue_event`` (and ``enqueue_events`` for a batch) writes, inside the caller's transaction,
the event to the tenant's webhook log and one pending delivery per enabled endpoint subscribed to
its type: an event exists if and only if the caller's change committed, and it is in the log
before any process sends it. Tenants without any endpoint pay one index scan a batch and get no rows
(their log starts when they register their first endpoint, so a replay reaches back to then).

Payload (the signed body)::

    {"type": "notification.sent", "timestamp": "2026-11-25T09:00:00.123456Z",
     "data": {"notification_id": "...", ...}}

Ordering: deliveries run in parallel and retries reorder them; a receiver orders one
notification's events by ``timestamp`` (microseconds, when the outcome was recorded), then by
``webhook-id`` (a UUIDv7, time ordered).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg
from sqlalchemy.ext.asyncio import AsyncConnection

from schema.enums import EngagementType
from schema.ids import uuid7_texts

OUTCOME_EVENT_TYPES = ("notification.sent", "notification.failed")
ENGAGEMENT_EVENT_TYPES = tuple(f"notification.{t.value}" for t in EngagementType)
"""``notification.delivered``, ``.bounced``, ``.opened``, ``.clicked``, ... (``core.engagement``)."""
EVENT_TYPES = OUTCOME_EVENT_TYPES + ENGAGEMENT_EVENT_TYPES
_OUTCOME_TYPES = {
    "sent": "notification.sent",
    "failed": "notification.failed",
    "dead": "notification.failed",
    "expired": "notification.failed",
}


def outcome_event_type(status: str) -> str | None:
    """The event a recorded delivery outcome emits (``sent``, and the terminal failures), if any."""
    return _OUTCOME_TYPES.get(status)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookEventIn:
    tenant_id: str
    notification_id: UUID | None
    type: str
    data: Mapping[str, Any]  # JSON values only
    occurred_at: datetime


# One statement per batch, whatever its size. Its events come as parallel arrays beside one JSON
# array of their bodies, encoded in one call (``bodies_of``) and split by ``json_array_elements``
# (a ``json`` value keeps each element's text as sent; ``jsonb`` would re-encode it). Only the
# events of tenants with an endpoint are logged (one index scan for the batch's tenants); each
# enabled endpoint subscribed to one of the batch's types is locked once (``endpoint``), and a
# delivery is queued per event and endpoint subscribed to its type.
# Before (2026-11-29), each body was ``json.dumps``-ed alone, each id a ``uuid7()`` call, each
# time sent as a datetime (asyncpg encodes one in 1.8 us), and the join locked its endpoint once per
# delivery. Medians before -> after, calls of both versions alternated A B B A in one process
# (20 rounds; ranges over two kinds of event, quiet machine):
#   500 events, tenant with an endpoint     18.3-19.1 -> 13.1-13.9 ms (caller's CPU 9.3-9.5 -> 3.3-3.4)
#   500 events, tenant without one          10.0-10.1 ->  4.5-4.6 ms  (CPU 9.1-9.3 -> 3.2)
#   20 events, with / without an endpoint    1.11-1.13 -> 0.93-0.97 / 0.73-0.75 -> 0.50-0.59 ms
#   one event                                0.31-0.41 ms either way
# ``bench.sendgrid_batch --endpoint`` (25,000 opens), A B B A twice: 1.85-1.95 -> 1.57-1.67 s. What
# is left with an endpoint is mostly PostgreSQL writing two rows an event and their seven indexes.
ENQUEUE = """
WITH v AS (
    SELECT r.id, r.tenant_id, r.notification_id, r.type, r.stamp::timestamptz AS occurred_at, r.body::text AS body
      FROM ROWS FROM (unnest($1::uuid[]), unnest($2::text[]), unnest($3::uuid[]), unnest($4::text[]),
                      unnest($5::text[]), json_array_elements($6::text::json))
           AS r(id, tenant_id, notification_id, type, stamp, body)
     WHERE r.tenant_id = ANY(ARRAY(SELECT tenant_id FROM webhook_endpoints WHERE tenant_id = ANY($7::text[])))
), endpoint AS (
    SELECT id, tenant_id, event_types FROM webhook_endpoints
     WHERE tenant_id = ANY($7::text[]) AND enabled AND event_types && $8::text[]
       FOR KEY SHARE
), logged AS (
    INSERT INTO webhook_events (id, tenant_id, notification_id, type, occurred_at, body)
    SELECT id, tenant_id, notification_id, type, occurred_at, body FROM v
)
INSERT INTO webhook_deliveries (id, endpoint_id, tenant_id, event_id, event_type, body)
SELECT gen_random_uuid(), e.id, v.tenant_id, v.id, v.type, v.body
  FROM v JOIN endpoint e ON e.tenant_id = v.tenant_id AND v.type = ANY(e.event_types)
"""
# ``FOR KEY SHARE`` (what a foreign key check takes; no other writer of the endpoint waits for it)
# holds each endpoint queued to until this transaction commits, for ``LOCK_ENDPOINT``: disabling (by
# the tenant or by Clarion after a failure streak) or deleting an endpoint waits for the deliveries
# being queued to it, so its park or cancel sees them; an enqueue that comes while it is held waits,
# and then reads the endpoint disabled or gone (the lock rechecks ``enabled`` on the row it waited
# for). Before, those committed just after it stayed due for an endpoint disabled or gone, which
# every claim of ``clarion webhooks`` then read past.
LOCK_ENDPOINT = "SELECT 1 FROM webhook_endpoints WHERE id = $1 FOR UPDATE"


# A disabled endpoint's pending deliveries wait at PARKED_AT, outside the claim's index range
# (``next_attempt_at <= now()``): a large backlog of a disabled endpoint costs every claim nothing.
PARKED_AT = "9999-01-01 00:00:00+00"
PARK_PENDING = f"""
UPDATE webhook_deliveries SET next_attempt_at = '{PARKED_AT}'
 WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at < '{PARKED_AT}'
"""
UNPARK_PENDING = f"""
UPDATE webhook_deliveries SET next_attempt_at = now()
 WHERE endpoint_id = $1 AND state = 'pending' AND next_attempt_at >= '{PARKED_AT}'
"""


_TYPES = frozenset(EVENT_TYPES)
_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def bodies_of(events: Sequence[WebhookEventIn]) -> tuple[list[str], str]:
    """Each event's timestamp as its body states it (formatted once per distinct time), and a JSON
    array of their bodies, the JSON text that is stored, signed and sent (ASCII: no byte can differ
    on the way), encoded in one call."""
    formatted: dict[datetime, str] = {}
    stamps = []
    bodies = []
    for e in events:
        stamp = formatted.get(e.occurred_at)
        if stamp is None:
            stamp = formatted[e.occurred_at] = e.occurred_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        stamps.append(stamp)
        data = e.data if type(e.data) is dict else dict(e.data)
        bodies.append({"type": e.type, "timestamp": stamp, "data": data})
    return stamps, _ENCODE(bodies)


async def enqueue_events(
    conn: asyncpg.Connection | AsyncConnection, *, events: Sequence[WebhookEventIn]
) -> None:
    """Log ``events`` and queue their deliveries, in ``conn``'s open transaction (one statement).

    Errors: ``ValueError`` for a type outside ``EVENT_TYPES`` or data JSON cannot hold (NaN,
    infinity); database errors pass through (and roll the caller's transaction back with them)."""
    if not events:
        return
    types = {e.type for e in events}
    if not types <= _TYPES:
        raise ValueError(f"unknown webhook event type {min(types - _TYPES)!r}")
    stamps, bodies = bodies_of(events)
    args = (
        uuid7_texts(len(events)),
        [e.tenant_id for e in events],
        [e.notification_id for e in events],
        [e.type for e in events],
        stamps,
        bodies,
        list({e.tenant_id for e in events}),
        list(types),
    )
    if isinstance(conn, AsyncConnection):
        await conn.exec_driver_sql(ENQUEUE, args)
    else:
        await conn.execute(ENQUEUE, *args)


async def enqueue_event(
    conn: asyncpg.Connection | AsyncConnection,
    *,
    tenant_id: str,
    notification_id: UUID | None,
    type: str,
    data: Mapping[str, Any],
    occurred_at: datetime,
) -> None:
    """One event (see ``enqueue_events``): e.g. ``notification.opened`` from engagement tracking."""
    await enqueue_events(
        conn,
        events=[
            WebhookEventIn(
                tenant_id=tenant_id,
                notification_id=notification_id,
                type=type,
                data=data,
                occurred_at=occurred_at,
            )
        ],
    )
