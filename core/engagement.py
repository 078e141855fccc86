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
- only for a notification that is in the log: the statement that takes the row checks it (there
  is no foreign key, migration 0012), so a report racing its notification's drop stores nothing.

A batch is folded whole, in a handful of statements whatever its size: its rows are claimed
(locked in key order, a new one made counting nothing yet) and read, its events folded into them
here in order, exactly as one at a time (a repeat of the batch's own marker is a replay, the cap
counts the batch's own reports), then what was counted is written at once, with the rollups' first
events and the webhook events. It was a statement or two per event: 25,000 opens of 1,000 emails
held SendGrid's turn 11.6-16.3 s (50 transactions of 230-320 ms), and 1.7-2.9 s so (28-50 ms
each); its retry, every open a replay, 13.4-21.9 s and 0.75-0.81 s (``python -m
bench.sendgrid_batch``, three runs each, alternated, 2026-11-29). One event alone (a tracking
hit, an API report) costs a round trip more than the one upsert it was: a row's first 0.9-1.1 ->
1.5 ms, a repeat 0.6-0.7 -> 1.0 ms, a replay the same (a probe of 300 calls, two runs each).

Errors: asyncpg errors pass through (the caller's transaction decides).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

import asyncpg

from core.analytics import ENGAGEMENT_COUNTS, RollupKey, add_many, hour_of
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


# The rows of a batch's keys, locked in key order and returned as they were: a key without a row
# gets one counting nothing yet (``count`` 0, rolled back with the caller's transaction if it is not
# counted into), so no other writer can insert it between this read and the write below, and its
# first events lock it as they would have. Only for a notification in the log, found key by key
# by its primary key (LATERAL ... LIMIT 1, its tenant checked outside): as a semi join the planner
# hashed every partition of the log, 234 ms for 500 keys against 30 days of 10,000 notifications,
# 11 ms key by key; and with the tenant inside, a day not yet analyzed was searched by
# (tenant_id, created_at), which a batch of sends shares: 110 ms for 500 keys of 2,000 such
# notifications, 12 ms by the primary key (EXPLAIN ANALYZE, 2026-11-29). ``hooked``: the row's
# tenant has a webhook endpoint (one index scan for the batch), so a tenant without one gets no
# webhook event built, encoded and sent to be dropped (``bench.sendgrid_batch``, 25,000 opens of a
# tenant without one: 1.21-1.32 s -> 0.88-0.90 s, and 1.68-1.90 -> 1.72-1.77 s with one; two runs
# each alternated A B B A, twice, 2026-11-29).
_CLAIM = """
INSERT INTO engagement AS e (notification_id, type, link, tenant_id, notification_created_at,
                             first_at, last_at, count, source, seen)
SELECT k.id, k.type, k.link, k.tenant_id, k.created_at, k.at, k.at, 0, k.source, '{}'
  FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::timestamptz[],
              $7::text[]) WITH ORDINALITY AS k(id, type, link, tenant_id, created_at, at, source, ord)
 CROSS JOIN LATERAL (SELECT n.tenant_id FROM notifications n
                      WHERE n.id = k.id AND n.created_at = k.created_at LIMIT 1) AS n
 WHERE n.tenant_id = k.tenant_id
 ORDER BY k.ord
ON CONFLICT (notification_id, type, link, tenant_id, notification_created_at) DO UPDATE SET count = e.count
RETURNING e.notification_id, e.type, e.link, e.tenant_id, e.notification_created_at, e.count, e.seen,
          e.tenant_id = ANY(ARRAY(SELECT tenant_id FROM webhook_endpoints WHERE tenant_id = ANY($8::text[])))
              AS hooked
"""
# What the batch counted into each claimed row (every row is there and locked: the update path).
_ADD = """
INSERT INTO engagement AS e (notification_id, type, link, tenant_id, notification_created_at,
                             first_at, last_at, count, source, seen)
SELECT k.id, k.type, k.link, k.tenant_id, k.created_at, k.first_at, k.last_at, k.added, k.source,
       ARRAY(SELECT jsonb_array_elements_text(k.markers::jsonb))
  FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::timestamptz[], $6::timestamptz[],
              $7::timestamptz[], $8::int[], $9::text[], $10::text[]) WITH ORDINALITY
       AS k(id, type, link, tenant_id, created_at, first_at, last_at, added, source, markers, ord)
 ORDER BY k.ord
ON CONFLICT (notification_id, type, link, tenant_id, notification_created_at) DO UPDATE
   SET first_at = least(e.first_at, excluded.first_at),
       last_at = greatest(e.last_at, excluded.last_at),
       count = e.count + excluded.count,
       seen = e.seen || excluded.seen
"""
# The analytics keys of the notifications whose first event of a type this batch holds; a click
# only when no row had a click on any link before (the rows this batch claimed still count 0).
# Key by key, as the claim (as a join and NOT EXISTS, every partition of both tables was read:
# 1,235 ms for those 500 keys; 6 ms key by key).
_FIRSTS = """
SELECT k.type, n.tenant_id, n.created_at, n.channel, n.template, n.template_version, n.category,
       n.provider
  FROM unnest($1::uuid[], $2::text[], $3::timestamptz[], $4::text[]) AS k(id, tenant_id, created_at, type)
 CROSS JOIN LATERAL (SELECT * FROM notifications n WHERE n.id = k.id AND n.created_at = k.created_at
                      LIMIT 1) AS n
  LEFT JOIN LATERAL (SELECT 1 AS one FROM engagement e
                      WHERE e.notification_id = k.id AND e.type = 'clicked' AND e.tenant_id = k.tenant_id
                        AND e.notification_created_at = k.created_at AND e.count > 0
                      LIMIT 1) AS before ON k.type = 'clicked'
 WHERE n.tenant_id = k.tenant_id AND before.one IS NULL
"""

# (notification, type, link, tenant, notification_created_at): an engagement row's key.
_Key = tuple[UUID, str, str, str, datetime]


@dataclass(slots=True)
class _Row:
    """An engagement row while a batch is folded into it (the claim's count and markers, then
    what each counted event adds)."""

    count: int
    seen: set[str]
    fresh: bool  # claimed by this batch: its first events of a type (core.analytics)
    added: list[str | None] = field(default_factory=list)  # each counted event's marker, in order
    first_at: datetime | None = None
    last_at: datetime | None = None

    def fold(self, event: EngagementEvent, marker: str | None) -> Recorded:
        """Count ``event`` unless its marker is kept (a replay) or the row is full (capped)."""
        if marker is not None and marker in self.seen:
            return Recorded(event=event, counted=False)
        if self.count >= MAX_COUNTED:
            return Recorded(event=event, counted=False, capped=True)
        self.count += 1
        if marker is not None:
            self.seen.add(marker)
        self.added.append(marker)
        self.first_at = event.at if self.first_at is None else min(self.first_at, event.at)
        self.last_at = event.at if self.last_at is None else max(self.last_at, event.at)
        return Recorded(event=event, counted=True)


def _key_of(event: EngagementEvent) -> _Key:
    return (event.notification_id, event.type.value, cut_link(event.link), event.tenant_id,
            event.notification_created_at)  # fmt: skip


def _marker(event: EngagementEvent) -> str | None:
    """The event's marker as a row keeps it: cut, and storable (no NUL or lone surrogate)."""
    if not event.marker:
        return None
    return event.marker[:MAX_MARKER_CHARS].replace("\x00", "").encode("utf-8", "replace").decode()


def _sort_key(e: EngagementEvent) -> tuple[str, str, str]:
    return (str(e.notification_id), e.type.value, e.link)


def _columns(rows: list[tuple[object, ...]]) -> list[list[object]]:
    return [list(column) for column in zip(*rows, strict=True)]


async def record_engagement(*, conn: asyncpg.Connection, events: list[EngagementEvent]) -> list[Recorded]:
    """Fold ``events`` into their rows, rows locked in key order (two batches touching the same rows
    lock them in the same order), events in that order too; returns each event with whether it was
    counted. Runs in the caller's transaction: a few statements for the whole batch, whatever its size."""
    ordered = sorted(events, key=_sort_key)
    first = {_key_of(e): e for e in reversed(ordered)}  # each key's first event: the row's source
    keys = sorted(first, key=lambda k: (str(k[0]), *k[1:]))
    if not keys:
        return []
    claimed = await conn.fetch(
        _CLAIM, *_columns([(*k, first[k].at, first[k].source) for k in keys]), list({k[3] for k in keys})
    )
    rows = {tuple(r[:5]): _Row(count=r["count"], seen=set(r["seen"]), fresh=r["count"] == 0) for r in claimed}
    # An event of a notification not in the log has no row: not counted (and not capped).
    recorded = [
        row.fold(e, _marker(e))
        if (row := rows.get(_key_of(e))) is not None
        else Recorded(event=e, counted=False)
        for e in ordered
    ]
    added = [(k, row) for k in keys if (row := rows.get(k)) is not None and row.added]
    await _count_firsts(conn, [k for k, row in added if row.fresh])
    if added:
        await conn.execute(_ADD, *_columns([
            (*k, row.first_at, row.last_at, len(row.added), first[k].source,
             json.dumps([m for m in row.added if m is not None]))
            for k, row in added
        ]))  # fmt: skip
    # The tenant's webhooks, in the same transaction: a counted report is an event, a replay is not.
    hooked = {r["tenant_id"] for r in claimed if r["hooked"]}
    await enqueue_events(
        conn, events=[webhook_event(r.event) for r in recorded if r.counted and r.event.tenant_id in hooked]
    )
    return recorded


async def _count_firsts(conn: asyncpg.Connection, fresh: list[_Key]) -> None:
    """The analytics rollups of the notifications' first events of a type (a click: on any link)."""
    firsts = {(k[0], k[3], k[4], k[1]) for k in fresh if k[1] in ENGAGEMENT_COUNTS}
    if not firsts:
        return
    counts: dict[RollupKey, Counter[str]] = defaultdict(Counter)
    for n in await conn.fetch(_FIRSTS, *_columns(list(firsts))):
        key = RollupKey(
            tenant_id=n["tenant_id"], hour=hour_of(n["created_at"]), channel=n["channel"],
            template=n["template"] or "", template_version=n["template_version"] or 0,
            category=n["category"] or "", provider=n["provider"] or "",
        )  # fmt: skip
        counts[key][n["type"]] += 1
    await add_many(conn=conn, counts=counts)


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
