"""The SendGrid Event Webhook: a signed JSON batch of events about the emails Clarion sent.

What each event does (status history, opt-outs, engagement, replays) is described in
``api.webhooks``; this module checks the batch's signature (`api.sendgrid_signature`) and records
it in one transaction.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg

from api.callback_gate import LOCK_TIMEOUT_MS, SENDGRID, CallbackGate, callback_busy
from api.engagement import clamp, count_recorded
from api.errors import ApiError
from api.sendgrid_signature import check_key, sendgrid_signature_valid
from api.webhooks import OptOut, WebhookResult, count_event, now_iso, opt_out_all
from core.engagement import EngagementEvent, record_engagement
from schema.enums import EngagementType
from schema.ids import created_window

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
_ENGAGEMENT_ONLY_EVENT = {EngagementType.opened: "open", EngagementType.clicked: "click"}


_FIND_EMAILS = """
SELECT n.id, n.tenant_id, n.created_at, n.user_id, n.category, n.history, u.email, coalesce(c.required, false) AS required
  FROM notifications n
  JOIN users u ON u.id = n.user_id
  LEFT JOIN categories c ON c.tenant_id = n.tenant_id AND c.name = n.category
 WHERE n.id = ANY($1::uuid[]) AND n.channel = 'email' AND n.created_at BETWEEN $2 AND $3
 ORDER BY n.id
 FOR UPDATE OF n
"""

_APPEND_EMAILS = """
UPDATE notifications n
   SET history = n.history || v.added::jsonb, updated_at = now()
  FROM unnest($1::uuid[], $2::text[]) AS v(id, added)
 WHERE n.id = v.id AND n.created_at BETWEEN $3 AND $4
"""


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


def _parse_events(payload: bytes) -> list[dict[str, Any]]:
    try:
        events = json.loads(payload)
    except (ValueError, RecursionError):  # RecursionError: nested past the interpreter's limit
        raise ApiError(400, "malformed_json", "The event batch is not valid JSON.") from None
    if not isinstance(events, list):
        raise ApiError(400, "malformed_json", "The event batch must be a JSON array.")
    return [e for e in events if isinstance(e, dict)]


def _notification_id(event: dict[str, Any]) -> UUID | None:
    try:
        return UUID(str(event.get("notification_id")))
    except ValueError:
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
class _Batch:
    """What a batch does to the notifications it names, gathered before it is written."""

    result: WebhookResult = field(default_factory=WebhookResult)
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
        for event in events:
            marker = _event_marker(event)
            if event["event"] in SENDGRID_ENGAGEMENT_ONLY:  # counted (or not) by the engagement row
                engaged = _engagement(event, row, marker, now)
                if engaged is not None:
                    self.engaged.append(engaged)
                continue
            if marker is not None and marker in seen:
                self.result.duplicate += 1
                count_event("sendgrid", event["event"], "duplicate")
                continue
            if room <= 0:
                self.result.ignored += 1
                count_event("sendgrid", event["event"], "ignored")
                continue
            room -= 1
            detail = _event_detail(event, marker)
            if marker is not None:
                seen.add(marker)
            transitions.append({"status": event["event"], "at": now_iso(), "detail": detail})
            self.result.recorded += 1
            count_event("sendgrid", event["event"], "recorded")
            engaged = _engagement(event, row, marker, now)
            if engaged is not None:
                self.engaged.append(engaged)
            opt_out = _email_opt_out(event, row)
            if opt_out is not None:
                self.opt_outs[(opt_out.user_id, opt_out.channel, opt_out.category)] = opt_out
        if transitions:
            self.ids.append(row["id"])
            self.added.append(json.dumps(transitions))


async def record_sendgrid_events(
    *,
    pool: asyncpg.Pool,
    gate: CallbackGate,
    public_key: str | None,
    payload: bytes,
    signature: str | None,
    timestamp: str | None,
) -> WebhookResult:
    """Verify one signed Event Webhook batch (over the raw bytes) and record its events on the
    notifications named by their ``notification_id`` custom arg, in one transaction.

    Raises ``ApiError`` 404 ``not_configured`` (no verification key), 403 ``invalid_signature``
    (bad or missing signature, or a timestamp more than 10 minutes off: nothing is changed),
    400 ``malformed_json`` or 429 ``callback_busy`` (no turn, or a notification's row held past its
    wait: ``api.callback_gate``; nothing is changed, and SendGrid retries the batch).
    """
    if public_key is None:
        raise ApiError(404, "not_configured", "The SendGrid Event Webhook is not configured.")
    check_key(public_key)
    if not sendgrid_signature_valid(
        public_key=public_key, payload=payload, signature=signature, timestamp=timestamp
    ):
        count_event("sendgrid", "-", "rejected")
        raise ApiError(
            403,
            "invalid_signature",
            "The Event Webhook signature does not match this request, or its timestamp is too old.",
        )
    batch = _Batch()
    result = batch.result
    wanted: dict[UUID, list[dict[str, Any]]] = {}
    for event in _parse_events(payload):
        kind = str(event.get("event") or "")
        nid = _notification_id(event)
        if kind not in SENDGRID_RECORDED and kind not in SENDGRID_ENGAGEMENT_ONLY:
            result.ignored += 1
            count_event("sendgrid", kind if kind in SENDGRID_KNOWN else "other", "ignored")
        elif nid is None:
            result.unknown += 1
            count_event("sendgrid", kind, "unknown")
        else:
            wanted.setdefault(nid, []).append(event)
    if not wanted:
        return result
    now = datetime.now(UTC)
    async with gate.sendgrid.turn(SENDGRID) as mine:
        if not mine:
            count_event("sendgrid", "-", "busy")
            raise callback_busy()
        try:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                rows = await conn.fetch(_FIND_EMAILS, list(wanted), *created_window(wanted))
                for row in rows:
                    batch.fold(row, wanted.pop(row["id"]), now)
                if batch.ids:
                    await conn.execute(_APPEND_EMAILS, batch.ids, batch.added, *created_window(batch.ids))
                await opt_out_all(conn, list(batch.opt_outs.values()))
                recorded = await record_engagement(conn=conn, events=batch.engaged)
        except asyncpg.LockNotAvailableError:
            count_event("sendgrid", "-", "busy")
            raise callback_busy() from None
    count_recorded(recorded, "email")
    for r in recorded:
        only = _ENGAGEMENT_ONLY_EVENT.get(r.event.type)
        if only is not None:  # the other events were counted when their history was written
            result.recorded += r.counted
            result.duplicate += not r.counted
            count_event("sendgrid", only, "recorded" if r.counted else "duplicate")
    for events in wanted.values():  # not an email notification of ours
        result.unknown += len(events)
        for event in events:
            count_event("sendgrid", event["event"], "unknown")
    result.opted_out = len(batch.opt_outs)
    return result
