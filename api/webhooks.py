"""Provider delivery reports: Twilio status callbacks here, the SendGrid Event Webhook in
``api.sendgrid_events``; what both share (the result, opt-outs, the metric) is here too.

Neither carries an API key: each request is authenticated by the provider's signature
(``X-Twilio-Signature``, HMAC-SHA1 with the account auth token, docs/providers.md 3.5; SendGrid's ECDSA
P-256 signature over timestamp + raw body, 4.5), and a request that fails it changes nothing.

What a report does to the log:

- It appends a transition to the notification's ``history`` (status = the provider's status or
  event name, ``detail`` starting with the provider's name) and leaves the main ``status`` as it
  is: ``sent`` means handed to the provider; these say what happened after.
- Reports are idempotent and never regress. Twilio: only final statuses (``delivered``,
  ``undelivered``, ``failed``) are recorded, and only the first one per notification (a late or
  repeated callback is a ``duplicate``). SendGrid: each ``sg_event_id`` is recorded once (the id is
  kept in the transition's detail).
- Twilio ``undelivered``/``failed`` with a DEAD-class ErrorCode also sets the notification's
  ``error_code``/``error_message``; 21610 (recipient replied STOP) and 30004 (blocked) opt the user
  out of SMS. SendGrid ``bounce`` (type ``bounce``), ``dropped``, ``spamreport`` and ``unsubscribe``
  opt the user out of email; ``group_unsubscribe`` out of the notification's category (unless the
  tenant marked it required). An opt-out applies only while the user's address is still the one
  the report is about.
- Engagement (``core.engagement``): Twilio ``delivered`` and ``undelivered`` (as ``bounced``), SendGrid
  ``delivered``, ``bounce`` (``bounced``), ``open``, ``click`` (with its ``url``), ``unsubscribe`` and
  ``group_unsubscribe`` (``unsubscribed``), ``spamreport`` (``complained``) each fold into the
  notification's engagement row; a replay (same sid and status, same ``sg_event_id``) is not counted
  again. ``open`` and ``click`` add nothing to the status history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import parse_qsl
from uuid import UUID

import asyncpg
from pydantic import BaseModel
from starlette.datastructures import FormData, UploadFile
from twilio.request_validator import RequestValidator

from api.callback_gate import LOCK_TIMEOUT_MS, CallbackGate, callback_busy
from api.engagement import count_recorded
from api.errors import ApiError
from clarion import metrics
from clarion.missing_days import once_more_if_moved
from core.engagement import EngagementEvent, Recorded, record_engagement
from core.preferences import record_opt_outs
from providers import twilio
from schema.enums import EngagementType
from schema.ids import created_window

TWILIO_FINAL = frozenset({"delivered", "undelivered", "failed"})
TWILIO_DEAD_CODES = twilio.DEAD_NUMBER_CODES
TWILIO_OPT_OUT_CODES = twilio.OPT_OUT_CODES

TWILIO_ENGAGEMENT = {"delivered": EngagementType.delivered, "undelivered": EngagementType.bounced}

TWILIO_SIGNATURE_HEADER = "X-Twilio-Signature"


class WebhookResult(BaseModel):
    """What one webhook request did: reports recorded, already seen, not of interest, not ours."""

    recorded: int = 0
    duplicate: int = 0
    ignored: int = 0
    unknown: int = 0
    opted_out: int = 0


@dataclass(frozen=True, slots=True)
class OptOut:
    user_id: UUID
    channel: str
    category: str


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def count_event(provider: str, event: str, result: str, n: int = 1) -> None:
    if n:
        metrics.PROVIDER_WEBHOOK_EVENTS.labels(provider, event, result).inc(n)


async def opt_out_all(conn: asyncpg.Connection, opt_outs: Sequence[OptOut]) -> None:
    await record_opt_outs(conn=conn, opt_outs=[(o.user_id, o.channel, o.category) for o in opt_outs])


# --- Twilio ---------------------------------------------------------------------------------------

_READ_SMS = """
SELECT n.id, n.tenant_id, n.created_at, n.user_id, n.history, u.phone
  FROM notifications n JOIN users u ON u.id = n.user_id
 WHERE n.channel = 'sms'
   AND CASE WHEN $2::uuid IS NULL THEN n.provider_message_id = $1
            ELSE n.id = $2::uuid AND coalesce(n.provider_message_id, $1) = $1 END
   AND n.created_at BETWEEN $3 AND $4
"""
_LOCK_SMS = _READ_SMS + " FOR UPDATE OF n"
# With our id (the signed callback URL's), the days its UUIDv7 names: 3 partitions probed, not
# every kept day (docs/partitioning.md, "Measured": 0.28 against 0.87 ms with 30 days). A report
# naming only Twilio's sid probes each day's provider_message_id index.
EVERY_DAY = (datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC))

_APPEND_SMS = """
UPDATE notifications
   SET history = history || jsonb_build_array($2::jsonb),
       error_code = coalesce($3, error_code),
       error_message = coalesce($4, error_message),
       updated_at = now()
 WHERE id = $1 AND created_at = $5
"""


def _twilio_engagement(row: asyncpg.Record, sid: str, status: str) -> list[EngagementEvent]:
    engaged = TWILIO_ENGAGEMENT.get(status)
    if engaged is None:  # failed: never handed to the carrier, not something the person saw
        return []
    event = EngagementEvent(
        tenant_id=row["tenant_id"],
        notification_id=row["id"],
        notification_created_at=row["created_at"],
        type=engaged,
        at=max(datetime.now(UTC), row["created_at"]),
        source="twilio",
        marker=f"twilio:{sid}:{status}",  # Twilio's replay repeats both
    )
    return [event]


def twilio_signature_valid(*, auth_token: str, url: str, params: FormData, signature: str | None) -> bool:
    """Whether ``signature`` is Twilio's for a form POST of ``params`` to ``url`` (the full public
    URL with its query), per the SDK's ``RequestValidator`` (also tries the URL with and without
    the default port, as Twilio's own helpers do)."""
    if not signature:
        return False
    return bool(RequestValidator(auth_token).validate(url, params, signature))


MAX_TWILIO_FIELDS = 100
MAX_SID_CHARS = 64  # Twilio's are 34 (SM or MM and 32 hex digits)


async def record_twilio_status(
    *,
    pool: asyncpg.Pool,
    gate: CallbackGate,
    auth_token: str | None,
    url: str,
    body: bytes,
    signature: str | None,
    notification_id: UUID | None = None,
) -> WebhookResult:
    """Verify one Twilio status callback and record it on the SMS whose sid it names (or, when the
    signed callback URL carries it, on ``notification_id``: the report may arrive before the worker
    has recorded the sid).

    Raises ``ApiError`` 404 ``not_configured`` (no auth token to verify with), 403
    ``invalid_signature`` (nothing is changed), 400 ``invalid_callback`` (a sid longer than Twilio's),
    404 ``unknown_message`` (no SMS has that sid) or 429 ``callback_busy`` (no turn, or the SMS's row
    held past its wait: ``api.callback_gate``).

    What can be refused without the form is refused before it is parsed: the route is anonymous,
    and a 65 KB body of 16,250 fields took 13.8 ms of the event loop to parse (before the 404 of an
    unconfigured install), more with the signature's sort and HMAC over every field; four loops of
    it took another tenant's accept p50 from 7 to 434 ms (2026-11-28, a helper's probe). A status
    callback has about twenty fields: past ``MAX_TWILIO_FIELDS`` the body is not Twilio's.
    """
    if auth_token is None:
        raise ApiError(404, "not_configured", "Twilio status callbacks are not configured.")
    if not signature or body.count(b"&") >= MAX_TWILIO_FIELDS:
        count_event("twilio", "-", "rejected")
        raise ApiError(403, "invalid_signature", "The X-Twilio-Signature does not match this request.")
    fields: list[tuple[str, str | UploadFile]] = list(
        parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    )
    form = FormData(fields)
    status = str(form.get("MessageStatus") or form.get("SmsStatus") or "")
    if not twilio_signature_valid(auth_token=auth_token, url=url, params=form, signature=signature):
        count_event("twilio", "-", "rejected")
        raise ApiError(403, "invalid_signature", "The X-Twilio-Signature does not match this request.")
    sid = str(form.get("MessageSid") or form.get("SmsSid") or "")
    if not sid or status not in TWILIO_FINAL:
        count_event("twilio", status or "-", "ignored")
        return WebhookResult(ignored=1)
    if len(sid) > MAX_SID_CHARS:
        count_event("twilio", status, "rejected")
        raise ApiError(400, "invalid_callback", f"A message sid is at most {MAX_SID_CHARS} characters.")
    code = str(form.get("ErrorCode") or "") or None
    window = created_window([notification_id]) if notification_id is not None else EVERY_DAY
    async with gate.twilio.turn(sid) as mine:
        if not mine:
            count_event("twilio", status, "busy")
            raise callback_busy()
        result = None
        try:
            async with pool.acquire() as conn:
                # A report already recorded (a replay, or Twilio's repeat) is this one read: no lock.
                row = await conn.fetchrow(_READ_SMS, sid, notification_id, *window)
                if row is not None and not _reported(row):

                    async def record() -> tuple[
                        asyncpg.Record | None, tuple[WebhookResult, list[Recorded]] | None
                    ]:
                        async with conn.transaction():
                            await conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                            locked = await conn.fetchrow(_LOCK_SMS, sid, notification_id, *window)
                            if locked is None or _reported(locked):
                                return locked, None
                            return locked, await _record_sms(
                                conn, row=locked, form=form, sid=sid, status=status, code=code
                            )

                    # Twilio does not retry a refused callback: one refused because its engagement
                    # day was moving out of a default partition is written again here.
                    row, result = await once_more_if_moved(record)
        except asyncpg.LockNotAvailableError:
            count_event("twilio", status, "busy")
            raise callback_busy() from None
    if result is not None:
        count_recorded(result[1], "sms")
        count_event("twilio", status, "recorded")
        return result[0]
    if row is None:
        count_event("twilio", status, "unknown")
        raise ApiError(404, "unknown_message", f"No SMS has the message sid {sid}.")
    count_event("twilio", status, "duplicate")
    return WebhookResult(duplicate=1)


def _reported(row: asyncpg.Record) -> bool:
    """Whether the SMS already has Twilio's final report (the first one is the one kept)."""
    history = json.loads(row["history"]) if isinstance(row["history"], str) else row["history"]
    return any(
        h.get("status") in TWILIO_FINAL and str(h.get("detail") or "").startswith("twilio ") for h in history
    )


async def _record_sms(
    conn: asyncpg.Connection, *, row: asyncpg.Record, form: FormData, sid: str, status: str, code: str | None
) -> tuple[WebhookResult, list[Recorded]]:
    """Record Twilio's final ``status`` on the SMS ``row`` (locked, not yet reported): what the
    request did, and what engagement it recorded (counted once the transaction commits)."""
    dead = code in TWILIO_DEAD_CODES and status != "delivered"
    detail = f"twilio {sid}: {status}" + (f", ErrorCode {code}" if code else "")
    if dead:
        detail += f" ({TWILIO_DEAD_CODES[code or '']})"
    transition = {"status": status, "at": now_iso(), "detail": detail}
    await conn.execute(
        _APPEND_SMS,
        row["id"],
        transition,  # the pool's jsonb codec encodes it
        code if dead else None,
        f"Twilio: {TWILIO_DEAD_CODES[code or '']} ({status})" if dead else None,
        row["created_at"],
    )
    opt_out = (
        status != "delivered"
        and code in TWILIO_OPT_OUT_CODES
        and row["phone"] is not None
        and row["phone"] == form.get("To", row["phone"])
    )
    if opt_out:
        await opt_out_all(conn, [OptOut(row["user_id"], "sms", "*")])
    recorded = await record_engagement(conn=conn, events=_twilio_engagement(row, sid, status))
    return WebhookResult(recorded=1, opted_out=int(opt_out)), recorded
