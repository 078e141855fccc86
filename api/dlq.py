"""Dead letters: listing the notifications that exhausted their retries, and redriving them.

The log is the truth: a dead notification is a ``notifications`` row with status ``dead`` (the
``.dlq`` topic carries a copy for tooling). A redrive moves matching rows back to ``retrying``,
due now, with the attempt and render-deferral counts reset to 0 (earlier ``delivery_attempts`` rows stay; the new
attempts are numbered from 1 again), then publishes them to their channel's lane. Rows whose
publish fails are republished by the relay (``retrying``, due, never published since), so a
redrive is never lost. It works in batches, each its own transaction, so a large redrive
neither holds locks for long nor starts over when interrupted: what is done is done.

A tenant's redrive (``POST /v1/ops/dlq/{channel}/redrive``) requeues at most
``MAX_REDRIVE_PER_CALL``, no more than its ``tenant`` rule admits now (``api/tenant_budget.py``,
the budget its sends are charged to), and says how many still match (``remaining``): a redrive
puts its notifications into the lane every tenant's sends share, so one call of a tenant with a
million dead letters would have queued them all ahead of everyone else's sends, and calls in a
loop would have done the same 10,000 at a time. The operator's ``clarion dlq redrive`` has no
such bound.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.json_types import IsoAwareDatetime
from api.outbox import republish
from api.search_limit import SearchLimit
from clarion.kafka import Publisher
from schema.enums import Channel, Priority

Progress = Callable[[int, int], None]


class DeadLetterError(BaseModel):
    code: str | None
    message: str | None = None


class DeadLetter(BaseModel):
    id: UUID
    event_id: str
    user_id: str = Field(description="the recipient's external id")
    channel: Channel
    category: str
    priority: Priority
    attempts: int
    provider: str | None = Field(description="the provider of the last attempt")
    error: DeadLetterError = Field(description="the last error")
    created_at: datetime
    dead_at: datetime


class DeadLetterPage(BaseModel):
    items: list[DeadLetter]
    next_cursor: UUID | None = Field(description="pass as `cursor` for the next page; null on the last")


class RedriveFilter(BaseModel):
    """Which dead notifications to redrive; every field narrows, none means all of the channel."""

    error_code: str | None = Field(default=None, max_length=64, description="last error code, exact")
    provider: str | None = Field(default=None, max_length=32, description="provider of the last attempt")
    since: IsoAwareDatetime | None = Field(
        default=None, description="died at or after this time (with a time zone)"
    )
    until: IsoAwareDatetime | None = Field(
        default=None, description="died before this time (with a time zone)"
    )


MAX_REDRIVE_PER_CALL = 10_000
REMAINING_COUNTED = 100_000  # ``remaining`` counts no further


class RedriveResult(BaseModel):
    requeued: int = Field(description="notifications moved back to `retrying` with attempts reset")
    published: int = Field(description="of those, how many the broker took now (the relay takes the rest)")
    remaining: int = Field(
        default=0, description="dead notifications still matching (past the call's bound): redrive again"
    )


def _where(tenant_id: str | None, channel: Channel, match: RedriveFilter) -> tuple[str, dict[str, Any]]:
    clauses = ["n.status = 'dead'", "n.channel = :channel"]
    params: dict[str, Any] = {"channel": channel.value}
    if tenant_id is not None:
        clauses.append("n.tenant_id = :tenant_id")
        params["tenant_id"] = tenant_id
    if match.error_code is not None:
        clauses.append("n.error_code = :error_code")
        params["error_code"] = match.error_code
    if match.provider is not None:
        clauses.append("n.provider = :provider")
        params["provider"] = match.provider
    if match.since is not None:
        clauses.append("n.updated_at >= :since")
        params["since"] = match.since
    if match.until is not None:
        clauses.append("n.updated_at < :until")
        params["until"] = match.until
    return " AND ".join(clauses), params


async def list_dead(
    *,
    engine: AsyncEngine,
    tenant_id: str | None,
    channel: Channel,
    match: RedriveFilter | None = None,
    limit: int = 50,
    cursor: UUID | None = None,
    searches: SearchLimit | None = None,
) -> DeadLetterPage:
    """Dead notifications of ``channel`` (one tenant's, or all with ``tenant_id=None``), newest
    first, ``limit`` per page; ``next_cursor`` continues after the last item. A filter matching
    few of many dead rows reads them all, so a tenant's listing through the API is one of its
    ``searches`` (``api/search_limit.py``); the operator's CLI passes none."""
    where, params = _where(tenant_id, channel, match or RedriveFilter())
    if cursor is not None:
        where += " AND n.id < :cursor"
        params["cursor"] = cursor
    query = sa.text(
        f"""
        SELECT n.id, n.event_id, u.external_id, n.channel, n.category, n.priority, n.attempts,
               n.provider, n.error_code, n.error_message, n.created_at, n.updated_at
          FROM notifications n JOIN users u ON u.id = n.user_id
         WHERE {where}
         ORDER BY n.id DESC
         LIMIT :limit
        """
    )
    connect: AbstractAsyncContextManager[AsyncConnection] = (
        searches.connect(engine=engine, tenant_id=tenant_id)
        if searches is not None and tenant_id is not None
        else engine.connect()
    )
    async with connect as conn:
        rows = (await conn.execute(query, {**params, "limit": limit + 1})).all()
    items = [
        DeadLetter(
            id=r.id,
            event_id=r.event_id,
            user_id=r.external_id,
            channel=r.channel,
            category=r.category,
            priority=r.priority,
            attempts=r.attempts,
            provider=r.provider,
            error=DeadLetterError(code=r.error_code, message=r.error_message),
            created_at=r.created_at,
            dead_at=r.updated_at,
        )
        for r in rows[:limit]
    ]
    return DeadLetterPage(items=items, next_cursor=items[-1].id if len(rows) > limit else None)


async def count_dead(
    *,
    engine: AsyncEngine,
    tenant_id: str | None,
    channel: Channel,
    match: RedriveFilter,
    at_most: int | None = None,
) -> int:
    """How many dead notifications ``match`` selects (counting no further than ``at_most``)."""
    where, params = _where(tenant_id, channel, match)
    bound = "" if at_most is None else f" LIMIT {int(at_most)}"
    query = sa.text(f"SELECT count(*) FROM (SELECT 1 FROM notifications n WHERE {where}{bound}) d")
    async with engine.connect() as conn:
        return int((await conn.execute(query, params)).scalar_one())


async def redrive(
    *,
    engine: AsyncEngine,
    publisher: Publisher | None,
    tenant_id: str | None,
    channel: Channel,
    match: RedriveFilter,
    batch: int = 1_000,
    limit: int | None = None,
    on_progress: Progress | None = None,
) -> RedriveResult:
    """Re-queue every dead notification ``match`` selects (at most ``limit``): status ``retrying``,
    due now, attempts reset, last error cleared (the history keeps it). Publishes each batch when
    ``publisher`` is given; the relay publishes what is not. ``on_progress(done, total)`` after
    each batch."""
    where, params = _where(tenant_id, channel, match)
    requeue = sa.text(
        f"""
        WITH picked AS (
            SELECT n.id, n.created_at FROM notifications n
             WHERE {where}
             ORDER BY n.id
             LIMIT :batch
             FOR UPDATE SKIP LOCKED
        )
        UPDATE notifications n
           SET status = 'retrying',
               attempts = 0,
               not_before = now(),
               lease_until = NULL,
               claims = 0,
               deferrals = 0,
               published_at = NULL,
               history = n.history || jsonb_build_array(jsonb_build_object(
                   'status', 'retrying',
                   'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
                   'detail', 'redriven from the DLQ; last error: ' || coalesce(n.error_code, 'none'))),
               error_code = NULL,
               error_message = NULL,
               updated_at = now()
          FROM picked
         WHERE n.id = picked.id AND n.created_at = picked.created_at
        RETURNING n.id, n.tenant_id, n.channel, n.user_id, n.priority
        """
    )
    total = 0
    if on_progress is not None:
        total = await count_dead(engine=engine, tenant_id=tenant_id, channel=channel, match=match)
        on_progress(0, total)
    result = RedriveResult(requeued=0, published=0)
    while limit is None or result.requeued < limit:
        size = batch if limit is None else min(batch, limit - result.requeued)
        async with engine.begin() as conn:
            rows = (await conn.execute(requeue, {**params, "batch": size})).all()
        if not rows:
            break
        result.requeued += len(rows)
        if publisher is not None:
            result.published += await republish(engine=engine, publisher=publisher, rows=rows)
        if on_progress is not None:
            on_progress(result.requeued, max(total, result.requeued))
        if len(rows) < size:
            break
    if limit is not None and result.requeued >= limit:  # what is left now, counted as far as a bound
        result.remaining = await count_dead(
            engine=engine, tenant_id=tenant_id, channel=channel, match=match, at_most=REMAINING_COUNTED
        )
    return result
