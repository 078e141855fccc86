"""The SendGrid Event Webhook: a signed JSON batch of events about the emails Clarion sent.

What each event does (status history, opt-outs, engagement, replays) is described in
``api.webhooks``; this module checks the batch's signature (`api.sendgrid_signature`) and records
it (what it does to each notification is gathered by ``api.sendgrid_fold``) in transactions of
about ``CHUNK_EVENTS`` events each, the notifications in id order.

One transaction held every notification a batch named until its last event was recorded: a 4 MB
batch of 25,000 opens of 1,000 emails took 15.7 s (2026-11-29, a statement or more per event), and
every other writer of those 1,000 rows, of any tenant, waited that long or was refused. A chunk
holds its rows for a chunk's time; a batch refused part way (``429 callback_busy``) has its chunks
so far recorded, and SendGrid's retry of it records the rest (each event once: its marker). Since,
a batch's body is at most 1 MiB (SendGrid posts at 768 KB: ``api.routes.webhooks``), and its
engagement is recorded a chunk in a few statements (``core.engagement``).
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg

from api.callback_gate import LOCK_TIMEOUT_MS, SENDGRID, CallbackGate, callback_busy
from api.engagement import count_recorded
from api.errors import ApiError
from api.sendgrid_fold import (
    MAX_HISTORY_EVENTS,
    MAX_REASON_CHARS,
    SENDGRID_ENGAGEMENT_ONLY,
    SENDGRID_KNOWN,
    SENDGRID_RECORDED,
    Fold,
    count_tally,
)
from api.sendgrid_signature import check_key, sendgrid_signature_valid
from api.webhooks import WebhookResult, count_event, opt_out_all
from clarion.missing_days import moved_out_of_default
from core.engagement import Recorded, record_engagement
from schema.enums import EngagementType
from schema.ids import created_window

__all__ = ["MAX_HISTORY_EVENTS", "MAX_REASON_CHARS", "record_sendgrid_events"]

CHUNK_EVENTS = 500

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


def _wanted(
    payload: bytes, result: WebhookResult, tally: Counter[tuple[str, str]]
) -> dict[UUID, list[dict[str, Any]]]:
    """The batch's events to record, by the notification they name; the others counted in
    ``result`` and ``tally`` (``400 malformed_json`` if the batch is not a JSON array)."""
    wanted: dict[UUID, list[dict[str, Any]]] = {}
    for event in _parse_events(payload):
        kind = str(event.get("event") or "")
        nid = _notification_id(event)
        if kind not in SENDGRID_RECORDED and kind not in SENDGRID_ENGAGEMENT_ONLY:
            result.ignored += 1
            tally[kind if kind in SENDGRID_KNOWN else "other", "ignored"] += 1
        elif nid is None:
            result.unknown += 1
            tally[kind, "unknown"] += 1
        else:
            wanted.setdefault(nid, []).append(event)
    return wanted


def _chunks(wanted: dict[UUID, list[dict[str, Any]]]) -> list[list[UUID]]:
    """The notifications in id order (the order every batch locks them in), cut after each
    ``CHUNK_EVENTS`` events."""
    chunks: list[list[UUID]] = [[]]
    size = 0
    for nid in sorted(wanted):
        if size >= CHUNK_EVENTS:
            chunks.append([])
            size = 0
        chunks[-1].append(nid)
        size += len(wanted[nid])
    return chunks


async def _record_chunk(
    conn: asyncpg.Connection, *, chunk: list[UUID], wanted: dict[UUID, list[dict[str, Any]]], fold: Fold
) -> list[Recorded]:
    """Record what ``wanted`` says of ``chunk``'s notifications into ``fold``, in one transaction;
    the notifications found are taken out of ``wanted``."""
    now = datetime.now(UTC)
    async with conn.transaction():
        await conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
        rows = await conn.fetch(_FIND_EMAILS, chunk, *created_window(chunk))
        for row in rows:
            fold.fold(row, wanted.pop(row["id"]), now)
        if fold.ids:
            await conn.execute(_APPEND_EMAILS, fold.ids, fold.added, *created_window(fold.ids))
        await opt_out_all(conn, list(fold.opt_outs.values()))
        return await record_engagement(conn=conn, events=fold.engaged)


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
    notifications named by their ``notification_id`` custom arg, a chunk of about ``CHUNK_EVENTS``
    events per transaction (the module's docstring says why).

    Raises ``ApiError`` 404 ``not_configured`` (no verification key), 403 ``invalid_signature``
    (bad or missing signature, or a timestamp more than 10 minutes off: nothing is changed),
    429 ``callback_busy`` (no turn: nothing is changed, the batch is not parsed; or a notification's
    row held past its wait: the chunks before it are kept, and SendGrid's retry of the batch
    records the rest, each event once; ``api.callback_gate``) or, with a turn, 400 ``malformed_json``.
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
    result = WebhookResult()
    opted_out: set[tuple[UUID, str, str]] = set()
    # The turn before the batch is parsed: under a flood most batches wait for a turn in vain, and
    # each parsed its 2,000 events first (~9 ms of the event loop, every other request waiting).
    # Another tenant's accept p99 under 40 loops of such batches (``bench.provider_callbacks``,
    # sendgrid-wide, three alternated runs): 562, 910 and 406 ms before, 170, 181 and 102 ms after
    # (the control 39-121 ms); its accepts in 6 s 85, 54, 127 -> 141, 176, 180.
    tally: Counter[tuple[str, str]] = Counter()  # the metric's counts: of the chunks that committed
    try:
        async with gate.sendgrid.turn(SENDGRID) as mine:
            if not mine:
                count_event("sendgrid", "-", "busy")
                raise callback_busy()
            wanted = _wanted(payload, result, tally)
            if not wanted:
                return result
            async with pool.acquire() as conn:
                for chunk in _chunks(wanted):
                    fold = Fold(result=result)
                    try:
                        done = await _record_chunk(conn, chunk=chunk, wanted=wanted, fold=fold)
                    except asyncpg.LockNotAvailableError:
                        count_event("sendgrid", "-", "busy")
                        raise callback_busy() from None
                    except asyncpg.CheckViolationError as exc:
                        # Its engagement's day was moving out of a default partition: SendGrid
                        # retries the 429, and the retry records what this chunk had, each event once.
                        if not moved_out_of_default(exc):
                            raise
                        count_event("sendgrid", "-", "busy")
                        raise callback_busy() from None
                    tally.update(fold.tally)
                    _count_engagement(done, result, tally)
                    opted_out |= set(fold.opt_outs)
        for events in wanted.values():  # not an email notification of ours
            result.unknown += len(events)
            tally.update((event["event"], "unknown") for event in events)
    finally:
        count_tally(tally)
    result.opted_out = len(opted_out)
    return result


def _count_engagement(
    recorded: list[Recorded], result: WebhookResult, tally: Counter[tuple[str, str]]
) -> None:
    """Count a committed chunk's engagement: the metrics, and its opens and clicks in ``result``
    (the other events were counted when their history was written)."""
    count_recorded(recorded, "email")
    for r in recorded:
        only = _ENGAGEMENT_ONLY_EVENT.get(r.event.type)
        if only is not None:
            result.recorded += r.counted
            result.duplicate += not r.counted
            tally[only, "recorded" if r.counted else "duplicate"] += 1
