"""The events a tenant's webhook endpoints receive, and the one way to emit them.

Emitted by the worker's record step (``sent``, ``failed``: ``workers.record``) and by
``core.engagement.record_engagement`` (each counted report: ``delivered``, ``opened``...).
``enqueue_event`` (and ``enqueue_events`` for a batch) writes, inside the caller's transaction,
the event to the tenant's webhook log and one pending delivery per enabled endpoint subscribed to
its type: an event exists if and only if the caller's change committed, and it is in the log
before any process sends it. Tenants without any endpoint pay one index probe and get no rows
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
from schema.ids import uuid7

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


ENQUEUE = """
WITH v AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::timestamptz[], $6::text[])
           AS v(id, tenant_id, notification_id, type, occurred_at, body)
     WHERE EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.tenant_id = v.tenant_id)
), ev AS (
    INSERT INTO webhook_events (id, tenant_id, notification_id, type, occurred_at, body)
    SELECT id, tenant_id, notification_id, type, occurred_at, body FROM v
    RETURNING id, tenant_id, type, body
)
INSERT INTO webhook_deliveries (id, endpoint_id, tenant_id, event_id, event_type, body)
SELECT gen_random_uuid(), e.id, ev.tenant_id, ev.id, ev.type, ev.body
  FROM ev JOIN webhook_endpoints e
    ON e.tenant_id = ev.tenant_id AND e.enabled AND ev.type = ANY(e.event_types)
   FOR KEY SHARE OF e
"""
# ``FOR KEY SHARE`` (what a foreign key check takes; no other writer of the endpoint waits for it)
# holds the endpoint until this transaction commits, for ``LOCK_ENDPOINT``: disabling (by the tenant
# or by Clarion after a failure streak) or deleting an endpoint waits for the deliveries being
# queued to it, so its park or cancel sees them. Before,
# those committed just after it stayed due for an endpoint disabled or gone, which every claim of
# ``clarion webhooks`` then read past.
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


def body_of(*, type: str, data: Mapping[str, Any], occurred_at: datetime) -> str:
    """The JSON text that is stored, signed and sent (ASCII: no byte can differ on the way)."""
    stamp = occurred_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return json.dumps({"type": type, "timestamp": stamp, "data": dict(data)}, separators=(",", ":"))


async def enqueue_events(
    conn: asyncpg.Connection | AsyncConnection, *, events: Sequence[WebhookEventIn]
) -> None:
    """Log ``events`` and queue their deliveries, in ``conn``'s open transaction (one statement).

    Errors: ``ValueError`` for a type outside ``EVENT_TYPES``; database errors pass through (and
    roll the caller's transaction back with them)."""
    if not events:
        return
    for event in events:
        if event.type not in EVENT_TYPES:
            raise ValueError(f"unknown webhook event type {event.type!r}")
    args = (
        [uuid7() for _ in events],
        [e.tenant_id for e in events],
        [e.notification_id for e in events],
        [e.type for e in events],
        [e.occurred_at for e in events],
        [body_of(type=e.type, data=e.data, occurred_at=e.occurred_at) for e in events],
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
