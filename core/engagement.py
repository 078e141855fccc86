"""Engagement: what happened to a notification after it was sent, one row per (type, link).

Every source (Twilio status callbacks, SendGrid events, a tenant's backend, a device holding the
push's token; later Clarion's own email tracking) reports an :class:`EngagementEvent`;
:func:`record_engagement` folds it into the ``engagement`` row of its notification, type and link:
``first_at``/``last_at`` widen, ``count`` grows by one, ``source`` keeps the first reporter.

Guarantees:

- idempotent under replays: an event whose ``marker`` (a provider event id, Twilio's sid and
  status, an API report's type/link/time) is among the row's markers changes nothing and comes
  back as not ``counted``. A row counts at most ``MAX_COUNTED`` reports, so it keeps the marker of
  every report it counted: past that, a report is ``capped``, not counted and no webhook event.
  (Until 2026-11-28 a row kept its last 64 markers and counted on: a helper replayed report 1 after
  70 others and it counted again, and anyone holding a tracked link made a webhook event per hit);
- never touches the notification's status: engagement is recorded beside the delivery status,
  so a late ``opened`` never regresses a ``failed`` or a ``sent``;
- bounded: a link is at most ``MAX_LINK_BYTES`` (callers cut or refuse longer ones), the markers
  kept per row at most ``MAX_COUNTED``, and so its ``count``.

- each counted report is also a ``notification.<type>`` webhook event (``core.webhook_events``),
  logged in the same transaction;
- only for a notification that is in the log: the upsert checks it in the same statement (there
  is no foreign key, migration 0012), so a report racing its notification's drop stores nothing.

Errors: asyncpg errors pass through (the caller's transaction decides).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from core.analytics import ENGAGEMENT_COUNTS, RollupKey, add_counts, hour_of
from core.webhook_events import WebhookEventIn, enqueue_events
from schema.enums import EngagementType

MAX_LINK_BYTES = 2048
# Distinct links one notification's clicks may name: a device holds its token for a month, and each
# new link is a row (api/engagement.py refuses the next); Clarion's tracking rewrites no more.
MAX_LINKS = 100
MAX_COUNTED = 64  # reports counted per (notification, type, link): opens and clicks of one person
MAX_MARKER_CHARS = 200


@dataclass(frozen=True, slots=True)
class EngagementEvent:
    """One report of something that happened to one notification."""

    tenant_id: str
    notification_id: UUID
    notification_created_at: datetime
    type: EngagementType
    at: datetime
    source: str
    link: str = ""
    marker: str | None = None


@dataclass(frozen=True, slots=True)
class Recorded:
    """The row after an event, and whether this event was counted (False: a replay)."""

    event: EngagementEvent
    counted: bool
    capped: bool = False  # not counted because the row has counted MAX_COUNTED reports already


def cut_link(link: str) -> str:
    """``link`` cut to ``MAX_LINK_BYTES`` of UTF-8 at a character boundary (a provider's URL can be
    longer than a key column may hold; two links equal up to there are one link)."""
    data = link.replace("\x00", "").encode("utf-8", "replace")
    return data[:MAX_LINK_BYTES].decode("utf-8", "ignore")


_UPSERT = f"""
INSERT INTO engagement AS e (notification_id, type, link, tenant_id, notification_created_at,
                             first_at, last_at, count, source, seen)
SELECT $1::uuid, $2::text, $3::text, $4::text, $5::timestamptz, $6::timestamptz, $6::timestamptz, 1, $7::text,
       CASE WHEN $8::text IS NULL THEN '{{}}' ELSE ARRAY[$8::text] END
 WHERE EXISTS (SELECT 1 FROM notifications WHERE id = $1 AND created_at = $5 AND tenant_id = $4)
ON CONFLICT (notification_id, type, link, tenant_id, notification_created_at) DO UPDATE
   SET first_at = least(e.first_at, excluded.first_at),
       last_at = greatest(e.last_at, excluded.last_at),
       count = e.count + 1,
       seen = e.seen || excluded.seen
 WHERE ($8::text IS NULL OR NOT ($8::text = ANY(e.seen))) AND e.count < {MAX_COUNTED}
RETURNING e.count = 1 AS inserted  -- an update makes it 2 or more (xmax is not there on a partitioned table)
"""
# Why an event was not counted: a replay (its marker is kept) or the row is full.
_CAPPED = """
SELECT count >= $6 AND ($5::text IS NULL OR NOT ($5::text = ANY(seen))) FROM engagement
 WHERE notification_id = $1 AND type = $2 AND link = $3 AND tenant_id = $4
   AND notification_created_at = $7
"""
# The notification's analytics key, for the first event of a type (core.analytics).
_KEY = """
SELECT channel, template, template_version, category, provider FROM notifications
 WHERE id = $1 AND tenant_id = $2 AND created_at = $3
"""
_OTHER_LINK = """
SELECT EXISTS (SELECT 1 FROM engagement WHERE notification_id = $1 AND type = 'clicked' AND link <> $2
                  AND tenant_id = $3 AND notification_created_at = $4)
"""


def _sort_key(e: EngagementEvent) -> tuple[str, str, str]:
    return (str(e.notification_id), e.type.value, e.link)


async def record_engagement(*, conn: asyncpg.Connection, events: list[EngagementEvent]) -> list[Recorded]:
    """Fold ``events`` into their rows, in key order (two batches touching the same rows lock them
    in the same order); returns each event with whether it was counted. Runs in the caller's
    transaction."""
    recorded: list[Recorded] = []
    for event in sorted(events, key=_sort_key):
        marker = event.marker[:MAX_MARKER_CHARS] if event.marker else None
        inserted = await conn.fetchval(
            _UPSERT,
            event.notification_id,
            event.type.value,
            cut_link(event.link),
            event.tenant_id,
            event.notification_created_at,
            event.at,
            event.source,
            marker,
        )
        if inserted is None:
            capped = await conn.fetchval(
                _CAPPED, event.notification_id, event.type.value, cut_link(event.link), event.tenant_id,
                marker, MAX_COUNTED, event.notification_created_at,
            )  # fmt: skip
            recorded.append(Recorded(event=event, counted=False, capped=bool(capped)))
            continue
        recorded.append(Recorded(event=event, counted=True))
        if inserted:
            await _count_first(conn, event)
    # The tenant's webhooks, in the same transaction: a counted report is an event, a replay is not.
    await enqueue_events(conn, events=[webhook_event(r.event) for r in recorded if r.counted])
    return recorded


async def _count_first(conn: asyncpg.Connection, event: EngagementEvent) -> None:
    """The analytics rollup of a notification's first event of a type (a click: on any link)."""
    count = event.type.value
    if count not in ENGAGEMENT_COUNTS:
        return  # e.g. prefetched: shown, never counted
    if event.type is EngagementType.clicked and await conn.fetchval(
        _OTHER_LINK,
        event.notification_id,
        cut_link(event.link),
        event.tenant_id,
        event.notification_created_at,
    ):
        return
    n = await conn.fetchrow(_KEY, event.notification_id, event.tenant_id, event.notification_created_at)
    if n is None:
        return
    key = RollupKey(
        tenant_id=event.tenant_id, hour=hour_of(event.notification_created_at), channel=n["channel"],
        template=n["template"] or "", template_version=n["template_version"] or 0,
        category=n["category"] or "", provider=n["provider"] or "",
    )  # fmt: skip
    await add_counts(conn=conn, count=count, keys=[key])


def webhook_event(event: EngagementEvent) -> WebhookEventIn:
    """The ``notification.<type>`` webhook event of a counted engagement report."""
    data = {
        "notification_id": str(event.notification_id),
        "type": event.type.value,
        "link": cut_link(event.link) or None,
        "source": event.source,
    }
    return WebhookEventIn(
        tenant_id=event.tenant_id,
        notification_id=event.notification_id,
        type=f"notification.{event.type.value}",
        data=data,
        occurred_at=event.at,
    )
