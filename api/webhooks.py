"""Provider delivery reports: Twilio status callbacks and the SendGrid Event Webhook.

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
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from pydantic import BaseModel
from sendgrid.helpers.eventwebhook import EventWebhook
from starlette.datastructures import FormData
from twilio.request_validator import RequestValidator

from api.errors import ApiError
from clarion import metrics
from core.preferences import record_opt_outs
from providers import twilio
from schema.ids import created_window

TWILIO_FINAL = frozenset({"delivered", "undelivered", "failed"})
TWILIO_DEAD_CODES = twilio.DEAD_NUMBER_CODES
TWILIO_OPT_OUT_CODES = twilio.OPT_OUT_CODES

SENDGRID_RECORDED = frozenset(
    {"delivered", "bounce", "dropped", "deferred", "spamreport", "unsubscribe", "group_unsubscribe"}
)
SENDGRID_KNOWN = SENDGRID_RECORDED | {"processed", "open", "click", "group_resubscribe"}
SENDGRID_MAX_AGE_S = 600.0

TWILIO_SIGNATURE_HEADER = "X-Twilio-Signature"
SENDGRID_SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
SENDGRID_TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"


class WebhookResult(BaseModel):
    """What one webhook request did: reports recorded, already seen, not of interest, not ours."""

    recorded: int = 0
    duplicate: int = 0
    ignored: int = 0
    unknown: int = 0
    opted_out: int = 0


@dataclass(frozen=True, slots=True)
class _OptOut:
    user_id: UUID
    channel: str
    category: str


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _count(provider: str, event: str, result: str, n: int = 1) -> None:
    if n:
        metrics.PROVIDER_WEBHOOK_EVENTS.labels(provider, event, result).inc(n)


async def _opt_out(conn: asyncpg.Connection, opt_outs: Sequence[_OptOut]) -> None:
    await record_opt_outs(conn=conn, opt_outs=[(o.user_id, o.channel, o.category) for o in opt_outs])


# --- Twilio ---------------------------------------------------------------------------------------

_FIND_SMS = """
SELECT n.id, n.created_at, n.user_id, n.history, u.phone
  FROM notifications n JOIN users u ON u.id = n.user_id
 WHERE n.channel = 'sms'
   AND CASE WHEN $2::uuid IS NULL THEN n.provider_message_id = $1
            ELSE n.id = $2::uuid AND coalesce(n.provider_message_id, $1) = $1 END
 FOR UPDATE OF n
"""

_APPEND_SMS = """
UPDATE notifications
   SET history = history || jsonb_build_array($2::jsonb),
       error_code = coalesce($3, error_code),
       error_message = coalesce($4, error_message),
       updated_at = now()
 WHERE id = $1 AND created_at = $5
"""


def twilio_signature_valid(*, auth_token: str, url: str, params: FormData, signature: str | None) -> bool:
    """Whether ``signature`` is Twilio's for a form POST of ``params`` to ``url`` (the full public
    URL with its query), per the SDK's ``RequestValidator`` (also tries the URL with and without
    the default port, as Twilio's own helpers do)."""
    if not signature:
        return False
    return bool(RequestValidator(auth_token).validate(url, params, signature))


async def record_twilio_status(
    *,
    pool: asyncpg.Pool,
    auth_token: str | None,
    url: str,
    params: Sequence[tuple[str, str]],
    signature: str | None,
    notification_id: UUID | None = None,
) -> WebhookResult:
    """Verify one Twilio status callback and record it on the SMS whose sid it names (or, when the
    signed callback URL carries it, on ``notification_id``: the report may arrive before the worker
    has recorded the sid).

    Raises ``ApiError`` 404 ``not_configured`` (no auth token to verify with), 403
    ``invalid_signature`` (nothing is changed) or 404 ``unknown_message`` (no SMS has that sid).
    """
    if auth_token is None:
        raise ApiError(404, "not_configured", "Twilio status callbacks are not configured.")
    form = FormData(list(params))
    status = str(form.get("MessageStatus") or form.get("SmsStatus") or "")
    if not twilio_signature_valid(auth_token=auth_token, url=url, params=form, signature=signature):
        _count("twilio", "-", "rejected")
        raise ApiError(403, "invalid_signature", "The X-Twilio-Signature does not match this request.")
    sid = str(form.get("MessageSid") or form.get("SmsSid") or "")
    if not sid or status not in TWILIO_FINAL:
        _count("twilio", status or "-", "ignored")
        return WebhookResult(ignored=1)
    code = str(form.get("ErrorCode") or "") or None
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(_FIND_SMS, sid, notification_id)
        if row is None:
            _count("twilio", status, "unknown")
            raise ApiError(404, "unknown_message", f"No SMS has the message sid {sid}.")
        history = json.loads(row["history"]) if isinstance(row["history"], str) else row["history"]
        if any(
            h.get("status") in TWILIO_FINAL and str(h.get("detail") or "").startswith("twilio ")
            for h in history
        ):
            _count("twilio", status, "duplicate")
            return WebhookResult(duplicate=1)
        dead = code in TWILIO_DEAD_CODES and status != "delivered"
        detail = f"twilio {sid}: {status}" + (f", ErrorCode {code}" if code else "")
        if dead:
            detail += f" ({TWILIO_DEAD_CODES[code or '']})"
        transition = {"status": status, "at": _now_iso(), "detail": detail}
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
            await _opt_out(conn, [_OptOut(row["user_id"], "sms", "*")])
    _count("twilio", status, "recorded")
    return WebhookResult(recorded=1, opted_out=int(opt_out))


# --- SendGrid -------------------------------------------------------------------------------------

_FIND_EMAILS = """
SELECT n.id, n.user_id, n.category, n.history, u.email, coalesce(c.required, false) AS required
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


@functools.lru_cache(maxsize=4)
def _ecdsa_key(public_key: str) -> EllipticCurvePublicKey:
    key = EventWebhook().convert_public_key_to_ecdsa(public_key)
    assert isinstance(key, EllipticCurvePublicKey)
    return key


def sendgrid_signature_valid(
    *,
    public_key: str,
    payload: bytes,
    signature: str | None,
    timestamp: str | None,
    now_s: float | None = None,
    max_age_s: float = SENDGRID_MAX_AGE_S,
) -> bool:
    """Whether ``signature`` is SendGrid's over ``timestamp`` + the raw ``payload`` for the base64 DER
    ``public_key`` (via the SDK's ``EventWebhook``), and the timestamp is at most ``max_age_s``
    seconds from now (an old, replayed batch is refused)."""
    if not signature or not timestamp:
        return False
    try:
        age_s = (time.time() if now_s is None else now_s) - int(timestamp)
        if abs(age_s) > max_age_s:
            return False
        key = _ecdsa_key(public_key)
        return bool(EventWebhook().verify_signature(payload.decode("utf-8"), signature, timestamp, key))
    except (ValueError, TypeError, binascii.Error):
        return False


def _check_key(public_key: str) -> None:
    try:
        base64.b64decode(public_key, validate=True)
        _ecdsa_key(public_key)
    except (ValueError, TypeError, binascii.Error) as exc:
        raise ApiError(
            503, "not_configured", "The configured SendGrid webhook public key is not a valid key."
        ) from exc


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


def _storable(text: str) -> str:
    """``text`` without what PostgreSQL's jsonb refuses (NUL) or cannot encode (lone surrogates):
    one such character in a ``reason`` made SendGrid's whole signed batch fail, on every retry."""
    return text.replace("\x00", "").encode("utf-8", "replace").decode()


def _event_detail(event: dict[str, Any], marker: str | None) -> str:
    kind = str(event["event"])
    facts = [f"type {event['type']}" if kind == "bounce" and event.get("type") else None]
    facts.append(str(event.get("reason") or event.get("response") or "") or None)
    text = "; ".join(f for f in facts if f)
    detail = f"sendgrid {kind}" + (f": {text}" if text else "") + (f" {marker}" if marker else "")
    return _storable(detail)


def _email_opt_out(event: dict[str, Any], row: asyncpg.Record) -> _OptOut | None:
    kind = event["event"]
    address = str(event.get("email") or "").lower()
    if not row["email"] or row["email"].lower() != address:
        return None  # the user has a different address by now
    if kind in ("spamreport", "unsubscribe", "dropped") or (
        kind == "bounce" and event.get("type") == "bounce"
    ):
        return _OptOut(row["user_id"], "email", "*")
    if kind == "group_unsubscribe" and not row["required"]:
        return _OptOut(row["user_id"], "email", row["category"])
    return None


def _parse_events(payload: bytes) -> list[dict[str, Any]]:
    try:
        events = json.loads(payload)
    except ValueError as exc:
        raise ApiError(400, "malformed_json", "The event batch is not valid JSON.") from exc
    if not isinstance(events, list):
        raise ApiError(400, "malformed_json", "The event batch must be a JSON array.")
    return [e for e in events if isinstance(e, dict)]


def _notification_id(event: dict[str, Any]) -> UUID | None:
    try:
        return UUID(str(event.get("notification_id")))
    except ValueError:
        return None


async def record_sendgrid_events(
    *,
    pool: asyncpg.Pool,
    public_key: str | None,
    payload: bytes,
    signature: str | None,
    timestamp: str | None,
) -> WebhookResult:
    """Verify one signed Event Webhook batch (over the raw bytes) and record its events on the
    notifications named by their ``notification_id`` custom arg, in one transaction.

    Raises ``ApiError`` 404 ``not_configured`` (no verification key), 403 ``invalid_signature``
    (bad or missing signature, or a timestamp more than 10 minutes off: nothing is changed) or
    400 ``malformed_json``.
    """
    if public_key is None:
        raise ApiError(404, "not_configured", "The SendGrid Event Webhook is not configured.")
    _check_key(public_key)
    if not sendgrid_signature_valid(
        public_key=public_key, payload=payload, signature=signature, timestamp=timestamp
    ):
        _count("sendgrid", "-", "rejected")
        raise ApiError(
            403,
            "invalid_signature",
            "The Event Webhook signature does not match this request, or its timestamp is too old.",
        )
    result = WebhookResult()
    wanted: dict[UUID, list[dict[str, Any]]] = {}
    for event in _parse_events(payload):
        kind = str(event.get("event") or "")
        nid = _notification_id(event)
        if kind not in SENDGRID_RECORDED:
            result.ignored += 1
            _count("sendgrid", kind if kind in SENDGRID_KNOWN else "other", "ignored")
        elif nid is None:
            result.unknown += 1
            _count("sendgrid", kind, "unknown")
        else:
            wanted.setdefault(nid, []).append(event)
    if not wanted:
        return result
    async with pool.acquire() as conn, conn.transaction():
        rows = await conn.fetch(_FIND_EMAILS, list(wanted), *created_window(wanted))
        ids: list[UUID] = []
        added: list[str] = []
        opt_outs: dict[tuple[UUID, str, str], _OptOut] = {}
        for row in rows:
            history = json.loads(row["history"]) if isinstance(row["history"], str) else row["history"]
            seen = " ".join(str(h.get("detail") or "") for h in history if h.get("detail"))
            transitions = []
            for event in wanted.pop(row["id"]):
                marker = _event_marker(event)
                if marker is not None and marker in seen:
                    result.duplicate += 1
                    _count("sendgrid", event["event"], "duplicate")
                    continue
                detail = _event_detail(event, marker)
                seen += " " + detail
                transitions.append({"status": event["event"], "at": _now_iso(), "detail": detail})
                result.recorded += 1
                _count("sendgrid", event["event"], "recorded")
                opt_out = _email_opt_out(event, row)
                if opt_out is not None:
                    opt_outs[(opt_out.user_id, opt_out.channel, opt_out.category)] = opt_out
            if transitions:
                ids.append(row["id"])
                added.append(json.dumps(transitions))
        if ids:
            await conn.execute(_APPEND_EMAILS, ids, added, *created_window(ids))
        await _opt_out(conn, list(opt_outs.values()))
    for events in wanted.values():  # not an email notification of ours
        result.unknown += len(events)
        for event in events:
            _count("sendgrid", event["event"], "unknown")
    result.opted_out = len(opt_outs)
    return result
