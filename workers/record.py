"""Record: one UPDATE for a batch of outcomes, one COPY for their attempts, then count and log.

The batch's Kafka offsets are committed only after this succeeds, and it is retried until it does
(``until_done``): once provider calls were made, claiming again would find the notifications leased
and send nothing, so the same outcomes must be written, however long the database is away.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import TypeVar
from uuid import UUID

import asyncpg

from clarion import metrics
from core.analytics import STATUS_COUNTS, RollupKey, add_many, hour_of
from core.webhook_events import WebhookEventIn, enqueue_events, outcome_event_type
from schema.enums import Channel, Status
from schema.ids import created_window
from workers.outcome import Outcome
from workers.render_deferral import RENDER_DEFERRED

log = logging.getLogger(__name__)
T = TypeVar("T")

# A render deferral is counted by the record that writes it: no write of its own.
RECORD = f"""
UPDATE notifications n
   SET status = v.status,
       attempts = n.attempts + v.calls,
       provider = coalesce(v.provider, n.provider),
       provider_message_id = coalesce(v.provider_message_id, n.provider_message_id),
       error_code = v.error_code,
       error_message = v.error_message,
       not_before = v.not_before,
       content_hash = coalesce(v.content_hash, n.content_hash),
       lease_until = NULL,
       claims = 0,
       deferrals = least(n.deferrals + (v.error_code IS NOT DISTINCT FROM '{RENDER_DEFERRED}')::int, 32767),
       updated_at = now(),
       history = n.history || jsonb_build_array(jsonb_build_object(
           'status', v.status,
           'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
           'detail', v.detail))
  FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[],
              $8::timestamptz[], $9::text[], $10::text[])
       AS v(id, status, calls, provider, provider_message_id, error_code, error_message, not_before, detail,
            content_hash)
 WHERE n.id = v.id AND n.status = 'sending' AND n.created_at BETWEEN $11 AND $12
RETURNING n.id, n.tenant_id, n.event_id, n.channel, n.status, n.provider, n.error_code, n.created_at,
          n.template, n.template_version, n.category,
          EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.tenant_id = n.tenant_id) AS has_endpoints
"""

ATTEMPT_COLUMNS = [
    "notification_id",
    "attempt",
    "provider",
    "recipient",
    "started_at",
    "finished_at",
    "outcome",
    "error_code",
    "error_message",
    "http_status",
    "provider_message_id",
]


def storable(text: str | None, limit: int = 2000) -> str | None:
    """``text`` as PostgreSQL can store it: at most ``limit`` characters (the column's length),
    NULs dropped, lone surrogates replaced. Provider answers and exception texts can quote a
    tenant's data, and one value PostgreSQL refused failed the whole batch's recording, forever."""
    if not text:
        return None
    text = text[:limit]
    if "\x00" in text:
        text = text.replace("\x00", "")
    if not text.isascii():
        text = text.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate becomes '?'
    return text or None


async def record_outcomes(*, pool: asyncpg.Pool, outcomes: list[Outcome]) -> None:
    """Write every outcome and its attempts in one transaction (or none of them). Every text is
    made storable first, so no value can make the recording fail for good."""
    if not outcomes:
        return
    columns: list[list[object]] = [[] for _ in range(10)]
    for o in outcomes:
        values = (
            o.notification_id,
            o.status,
            o.calls,
            storable(o.provider, 32),
            storable(o.provider_message_id, 10_000),
            storable(o.error_code, 64),
            storable(o.error_message),
            o.not_before,
            storable(o.detail),
            storable(o.content_hash, 64),
        )
        for column, value in zip(columns, values, strict=True):
            column.append(value)
    attempts = [
        (
            a.notification_id,
            a.attempt,
            storable(a.provider, 32) or "none",
            storable(a.recipient),
            a.started_at,
            a.finished_at,
            a.outcome,
            storable(a.error_code, 64),
            storable(a.error_message),
            a.http_status,
            storable(a.provider_message_id),
        )
        for o in outcomes
        for a in o.attempts
    ]
    async with pool.acquire() as conn, conn.transaction():
        recorded = await conn.fetch(RECORD, *columns, *created_window(o.notification_id for o in outcomes))
        await _count(conn, recorded)
        if attempts:
            await conn.copy_records_to_table("delivery_attempts", records=attempts, columns=ATTEMPT_COLUMNS)
        # In the same transaction: a webhook event exists if and only if its outcome was stored.
        await enqueue_events(conn, events=outcome_events(recorded))


def outcome_events(recorded: Sequence[asyncpg.Record]) -> list[WebhookEventIn]:
    """The webhook events of the outcomes ``RECORD`` stored (``sent`` and terminal failures), for
    the tenants that have an endpoint (``enqueue_events`` would store no other: building and
    encoding their bodies was ~2.5% of a worker's CPU under ``bench.e2e``, py-spy 2026-11-28)."""
    now = datetime.now(UTC)
    events = []
    for row in recorded:
        type_ = outcome_event_type(row["status"])
        if type_ is None or not row["has_endpoints"]:
            continue
        data = {
            "notification_id": str(row["id"]),
            "event_id": row["event_id"],
            "channel": row["channel"],
            "status": row["status"],
            "provider": row["provider"],
            "error_code": row["error_code"],
        }
        events.append(
            WebhookEventIn(
                tenant_id=row["tenant_id"], notification_id=row["id"], type=type_, data=data, occurred_at=now
            )
        )
    return events


async def _count(conn: asyncpg.Connection, recorded: list[asyncpg.Record]) -> None:
    """The analytics rollups of the rows this transaction moved to a final status (a replayed
    outcome moved none: it counts nothing), in one statement."""
    counts: dict[RollupKey, Counter[str]] = {}
    for r in recorded:
        count = STATUS_COUNTS.get(r["status"])
        if count is not None:
            key = RollupKey(
                tenant_id=r["tenant_id"], hour=hour_of(r["created_at"]), channel=r["channel"],
                template=r["template"] or "", template_version=r["template_version"] or 0,
                category=r["category"] or "", provider=r["provider"] or "",
            )  # fmt: skip
            counts.setdefault(key, Counter())[count] += 1
    await add_many(conn=conn, counts=counts)


async def record(
    *, pool: asyncpg.Pool, channel: Channel, outcomes: list[Outcome], events: dict[UUID, str]
) -> None:
    """Record ``outcomes`` (one transaction), then count and log them; ``events`` gives the event
    id of each notification for the log line (entries are removed as they are logged)."""
    await record_outcomes(pool=pool, outcomes=outcomes)
    for o in outcomes:
        metrics.OUTCOMES.labels(channel.value, o.provider or "none", o.status).inc()
        # Ids, status and error code only: bodies and addresses never reach the logs.
        log.log(
            logging.DEBUG if o.status is Status.sent else logging.INFO,
            "notification %s%s",
            o.status,
            f" ({o.error_code})" if o.error_code else "",
            extra={
                "notification_id": o.notification_id,
                "event_id": events.pop(o.notification_id, None),
                "channel": channel.value,
                "provider": o.provider,
            },
        )
        for a in o.attempts:
            metrics.PROVIDER_LATENCY.labels(a.provider, a.outcome).observe(
                (a.finished_at - a.started_at).total_seconds()
            )
            if a.error_code:
                metrics.PROVIDER_ERRORS.labels(a.provider, a.error_code).inc()
        if o.status is Status.retrying:
            metrics.RETRIES.labels(channel.value).inc()


async def until_done(what: str, step: Callable[[], Awaitable[T]]) -> T:
    """``step()``, retried with a growing pause (0.5 s doubling to 10 s) until it succeeds."""
    delay_s = 0.5
    while True:
        try:
            return await step()
        except Exception as exc:
            log.warning("batch not %s (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay_s)
        await asyncio.sleep(delay_s)
        delay_s = min(delay_s * 2, 10.0)
