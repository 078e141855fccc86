"""Recording what happened: one UPDATE for a batch of outcomes, one COPY for their attempts."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

import asyncpg


@dataclass(slots=True)
class Attempt:
    notification_id: UUID
    attempt: int
    provider: str
    recipient: str | None
    started_at: datetime
    finished_at: datetime
    outcome: str  # sent | transient | permanent | invalid_recipient
    error_code: str | None = None
    error_message: str | None = None
    http_status: int | None = None
    provider_message_id: str | None = None


@dataclass(slots=True)
class Outcome:
    notification_id: UUID
    status: str
    calls: int = 0
    provider: str | None = None
    provider_message_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    not_before: datetime | None = None
    detail: str | None = None
    content_hash: str | None = None
    attempts: list[Attempt] = field(default_factory=list)


RECORD = """
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
       updated_at = now(),
       history = n.history || jsonb_build_array(jsonb_build_object(
           'status', v.status,
           'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
           'detail', v.detail))
  FROM unnest($1::uuid[], $2::text[], $3::int[], $4::text[], $5::text[], $6::text[], $7::text[],
              $8::timestamptz[], $9::text[], $10::text[])
       AS v(id, status, calls, provider, provider_message_id, error_code, error_message, not_before, detail,
            content_hash)
 WHERE n.id = v.id AND n.status = 'sending'
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
        await conn.execute(RECORD, *columns)
        if attempts:
            await conn.copy_records_to_table("delivery_attempts", records=attempts, columns=ATTEMPT_COLUMNS)
