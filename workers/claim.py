"""The claim: a notification is sent only by the worker that claimed it (send-side dedupe).

The claim is one conditional UPDATE over the whole batch: a row moves to ``sending`` with a lease
only from a claimable state (or from ``sending`` whose lease expired: its worker died). A
redelivered Kafka message for a notification that is ``sent`` or leased elsewhere claims nothing,
so it causes no provider call. The only window for a second provider call is a worker dying after
the provider accepted and before the outcome was recorded, once the lease expires.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from clarion.rows import from_row
from schema.enums import Channel, Priority
from schema.ids import created_window
from schema.shown_status import STAMP_QUEUED


@dataclass(frozen=True, slots=True)
class InlineContent:
    """Content given with the send instead of a stored template (still Jinja source)."""

    body: str
    subject: str | None = None  # email
    title: str | None = None  # push
    html: str | None = None  # email

    @classmethod
    def of(cls, stored: Mapping[str, Any]) -> InlineContent:
        return cls(
            body=stored["body"],
            subject=stored.get("subject"),
            title=stored.get("title"),
            html=stored.get("html"),
        )

    def heading(self, channel: Channel) -> str | None:
        """The part rendered as the subject: an email's subject, a push's title."""
        return self.subject if channel is Channel.email else self.title


@dataclass(frozen=True, slots=True)
class ClaimedNotification:
    """A notification this worker holds the lease on, with its recipient's contact details: what
    every step between the claim and the record reads (the columns of ``CLAIM``'s RETURNING)."""

    id: UUID
    tenant_id: str
    event_id: str
    channel: Channel
    category: str
    priority: Priority
    template: str | None
    template_version: int | None
    locale: str | None
    content: InlineContent | None
    data: dict[str, Any]
    attempts: int
    """Provider calls (and infrastructure faults) spent so far."""
    claims: int
    """Claims since the last recorded outcome, this one included."""
    deferrals: int
    """Times a worker deferred it for its tenant's busy render turn (``workers/render_deferral.py``)."""
    expires_at: datetime | None
    user_id: UUID
    external_user_id: str
    email: str | None
    phone: str | None
    timezone: str | None
    quiet_hours_start: str | None  # "HH:MM", local time
    quiet_hours_end: str | None

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> ClaimedNotification:
        return from_row(
            cls,
            record,
            channel=Channel(record["channel"]),
            priority=Priority(record["priority"]),
            content=InlineContent.of(record["content"]) if record["content"] is not None else None,
            data=record["data"] or {},
            external_user_id=record["external_id"],
        )


# A message taken from the broker was queued: the claim stamps ``queued_at`` on an ``accepted`` row
# the API's outbox has not marked, so the history still shows ``accepted -> queued -> sending``. That
# is most rows: the outbox marks only the rows no worker has claimed within ``relay_grace_s / 3`` of
# the broker's ack (api/outbox.py), so the claim's rewrite stands in for the ack's.
CLAIM = f"""
UPDATE notifications n
   SET status = 'sending',
       {STAMP_QUEUED},
       claims = least(n.claims + 1, 32767),
       lease_until = now() + make_interval(secs => $2),
       updated_at = now(),
       history = n.history || jsonb_build_array(jsonb_build_object(
           'status', 'sending',
           'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
           'detail', NULL))
  FROM users u
 WHERE n.id = ANY($1::uuid[]) AND n.created_at BETWEEN $3 AND $4
   AND u.id = n.user_id
   AND ((n.status IN ('accepted', 'queued', 'retrying', 'delayed', 'scheduled')
         AND (n.not_before IS NULL OR n.not_before <= now()))
        OR (n.status = 'sending' AND n.lease_until < now()))
RETURNING n.id, n.tenant_id, n.event_id, n.channel, n.category, n.priority, n.template, n.template_version,
          n.locale, n.content, n.data, n.attempts, n.claims, n.deferrals, n.expires_at, n.user_id,
          u.external_id, u.email, u.phone, u.timezone, u.quiet_hours_start, u.quiet_hours_end
"""


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A claimed row that does not make a ``ClaimedNotification`` (content without a body, as a
    hand edit or an older writer could leave it): it fails alone, with the exception's class."""

    id: UUID
    event_id: str
    attempts: int
    error: str


async def claim(
    *, pool: asyncpg.Pool, ids: Sequence[UUID], lease_s: float
) -> tuple[list[ClaimedNotification], list[Unreadable]]:
    """Claim every notification in ``ids`` that may be sent now; return the claimed ones (and
    the claimed rows that cannot be read).

    Ids not returned are already done, leased by another worker, or not yet due: skip them.
    """
    if not ids:
        return [], []
    claimed: list[ClaimedNotification] = []
    unreadable: list[Unreadable] = []
    unique = list(dict.fromkeys(ids))
    for record in await pool.fetch(CLAIM, unique, lease_s, *created_window(unique)):
        try:
            claimed.append(ClaimedNotification.of(record))
        except Exception as exc:
            unreadable.append(
                Unreadable(record["id"], record["event_id"], record["attempts"], type(exc).__name__)
            )
    return claimed, unreadable
