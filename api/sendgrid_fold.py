"""What a SendGrid Event Webhook batch does to the email notifications it names, gathered per
notification before it is written (``api.sendgrid_events`` writes it): the status history's new
transitions (each event once, at most ``MAX_HISTORY_EVENTS`` of SendGrid's per notification), the
engagement events (at most ``MAX_COUNTED`` opens, or clicks of a link, per notification: its row
counts no more, and each past that was two statements for nothing), the opt-outs. What each event means is described in ``api.webhooks``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg

from api.engagement import clamp
from api.webhooks import OptOut, WebhookResult, count_event, now_iso
from core.engagement import MAX_COUNTED, EngagementEvent, cut_link
from schema.enums import EngagementType

SENDGRID_RECORDED = frozenset(
    {"delivered", "bounce", "dropped", "deferred", "spamreport", "unsubscribe", "group_unsubscribe"}
)
# Engagement only: these add nothing to the status history (a person opening a mail ten times).
SENDGRID_ENGAGEMENT_ONLY = frozenset({"open", "click"})
SENDGRID_KNOWN = SENDGRID_RECORDED | SENDGRID_ENGAGEMENT_ONLY | {"processed", "group_resubscribe"}
SENDGRID_ENGAGEMENT = {
    "delivered": EngagementType.delivered,
    "bounce": EngagementType.bounced,
    "open": EngagementType.opened,
    "click": EngagementType.clicked,
    "unsubscribe": EngagementType.unsubscribed,
    "group_unsubscribe": EngagementType.unsubscribed,
    "spamreport": EngagementType.complained,
}


def count_tally(tally: Counter[tuple[str, str]]) -> None:
    """``clarion_provider_webhook_events_total`` for a batch's events, once per (event, result): a
    labelled increment per event (4.5 us each) made a replayed batch of 2,000 events 54 ms of the
    API's event loop, 50 ms so (process_time, median of 20 replays, two alternated runs), and
    under a flood of such batches every other request waits for the loop."""
    for (event, result), n in tally.items():
        count_event("sendgrid", event, result, n)


def _event_marker(event: dict[str, Any]) -> str | None:
    """What tells a replayed event from a new one: its ``sg_event_id``, or, for events that carry
    none, (``sg_message_id``, event, timestamp), which SendGrid repeats unchanged on a replay."""
    event_id = event.get("sg_event_id")
    if isinstance(event_id, str) and event_id:
        return f"[sg_event_id={_storable(event_id)[:128]}]"
    message_id, at = event.get("sg_message_id"), event.get("timestamp")
    if isinstance(message_id, str) and message_id and isinstance(at, int | float | str):
        return f"[sg_event={_storable(message_id)[:128]}:{_storable(str(event.get('event')))[:32]}:{at}]"
    return None


# SendGrid reports a handful of delivery events per email (processed, a few deferrals, delivered
# or a bounce; opens and clicks go to the engagement rows, not the history). Past this many in one
# notification's history, more are counted as ignored: a replayed or runaway batch cannot grow a
# history, and every read of the notification, without bound.
MAX_HISTORY_EVENTS = 50
# SMTP replies run to a few hundred characters; past this a ``reason`` is cut, not stored whole:
# it was kept as it came, so one event of a 4 MB batch could put megabytes in a history that every
# read of the notification returns (50 of them: the history's cap, not its size).
MAX_REASON_CHARS = 1000


def _marker_in(detail: str) -> str | None:
    """The replay marker :func:`_event_detail` put at the end of ``detail``, if any."""
    at = detail.rfind(" [sg_event")
    return detail[at + 1 :] if at >= 0 and detail.endswith("]") else None


def _storable(text: str) -> str:
    """``text`` without what PostgreSQL's jsonb refuses (NUL) or cannot encode (lone surrogates):
    one such character in a ``reason`` made SendGrid's whole signed batch fail, on every retry."""
    return text.replace("\x00", "").encode("utf-8", "replace").decode()


def _event_detail(event: dict[str, Any], marker: str | None) -> str:
    kind = str(event["event"])
    facts = [f"type {event['type']}" if kind == "bounce" and event.get("type") else None]
    facts.append(str(event.get("reason") or event.get("response") or "") or None)
    text = "; ".join(f for f in facts if f)[:MAX_REASON_CHARS]
    detail = f"sendgrid {kind}" + (f": {text}" if text else "") + (f" {marker}" if marker else "")
    return _storable(detail)


def _email_opt_out(event: dict[str, Any], row: asyncpg.Record) -> OptOut | None:
    kind = event["event"]
    address = str(event.get("email") or "").lower()
    if not row["email"] or row["email"].lower() != address:
        return None  # the user has a different address by now
    if kind in ("spamreport", "unsubscribe", "dropped") or (
        kind == "bounce" and event.get("type") == "bounce"
    ):
        return OptOut(row["user_id"], "email", "*")
    if kind == "group_unsubscribe" and not row["required"]:
        return OptOut(row["user_id"], "email", row["category"])
    return None


def _occurred_at(event: dict[str, Any], row: asyncpg.Record, now: datetime) -> datetime:
    at = event.get("timestamp")
    try:
        when = datetime.fromtimestamp(float(at), UTC) if isinstance(at, int | float | str) else None
    except (ValueError, OverflowError, OSError):
        when = None
    return clamp(when, created_at=row["created_at"], now=now)


def _engagement(
    event: dict[str, Any], row: asyncpg.Record, marker: str | None, now: datetime
) -> EngagementEvent | None:
    kind = SENDGRID_ENGAGEMENT.get(event["event"])
    if kind is None:
        return None
    url = event.get("url") if kind is EngagementType.clicked else None
    return EngagementEvent(
        tenant_id=row["tenant_id"],
        notification_id=row["id"],
        notification_created_at=row["created_at"],
        type=kind,
        at=_occurred_at(event, row, now),
        source="sendgrid",
        link=_storable(url) if isinstance(url, str) else "",
        marker=marker,
    )


@dataclass
class Fold:
    """What a batch (or a chunk of it) does to the notifications it names, gathered before it is
    written; ``result`` may be shared by the chunks of one batch, ``tally`` is this fold's own."""

    result: WebhookResult = field(default_factory=WebhookResult)
    tally: Counter[tuple[str, str]] = field(default_factory=Counter)  # (event, result): see ``count_tally``
    ids: list[UUID] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    engaged: list[EngagementEvent] = field(default_factory=list)
    opt_outs: dict[tuple[UUID, str, str], OptOut] = field(default_factory=dict)

    def fold(self, row: asyncpg.Record, events: list[dict[str, Any]], now: datetime) -> None:
        history = json.loads(row["history"]) if isinstance(row["history"], str) else row["history"]
        details = [str(h.get("detail") or "") for h in history]
        # A set of the markers, not a search of every detail so far for each event: with one string
        # of them, 35,840 events on one notification took 6.5 s of the event loop, and more with
        # each replay (a fuzzing round, 2026-11-28).
        seen = {marker for detail in details if (marker := _marker_in(detail))}
        room = MAX_HISTORY_EVENTS - sum(detail.startswith("sendgrid ") for detail in details)
        transitions = []
        # This batch's distinct opens and clicks per row: a repeat of one in the batch is a duplicate
        # without a statement, and past MAX_COUNTED distinct ones the row counts no more (an event
        # without a marker is always a new one).
        taken: defaultdict[tuple[EngagementType, str], set[object]] = defaultdict(set)
        for event in events:
            marker = _event_marker(event)
            if event["event"] in SENDGRID_ENGAGEMENT_ONLY:  # counted (or not) by the engagement row
                engaged = _engagement(event, row, marker, now)
                if engaged is None:
                    continue
                seen_here = taken[engaged.type, cut_link(engaged.link)]
                if marker is not None and marker in seen_here:  # the row counts it once at most
                    self.result.duplicate += 1
                    self.tally[event["event"], "duplicate"] += 1
                    continue
                if len(seen_here) >= MAX_COUNTED:
                    # The row counts no more than MAX_COUNTED: the rest would be two statements each.
                    self.result.ignored += 1
                    self.tally[event["event"], "ignored"] += 1
                    continue
                seen_here.add(marker if marker is not None else object())
                self.engaged.append(engaged)
                continue
            if marker is not None and marker in seen:
                self.result.duplicate += 1
                self.tally[event["event"], "duplicate"] += 1
                continue
            if room <= 0:
                self.result.ignored += 1
                self.tally[event["event"], "ignored"] += 1
                continue
            room -= 1
            detail = _event_detail(event, marker)
            if marker is not None:
                seen.add(marker)
            transitions.append({"status": event["event"], "at": now_iso(), "detail": detail})
            self.result.recorded += 1
            self.tally[event["event"], "recorded"] += 1
            engaged = _engagement(event, row, marker, now)
            if engaged is not None:
                self.engaged.append(engaged)
            opt_out = _email_opt_out(event, row)
            if opt_out is not None:
                self.opt_outs[(opt_out.user_id, opt_out.channel, opt_out.category)] = opt_out
        if transitions:
            self.ids.append(row["id"])
            self.added.append(json.dumps(transitions))
