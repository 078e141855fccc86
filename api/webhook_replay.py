"""Replaying a tenant's webhook events to one of its endpoints, and showing recent deliveries.

A replay queues a new delivery of each logged event (the same ``webhook-id`` and body, so a
receiver that keeps ids drops what it already has) either from a time (``since``: every event the
endpoint subscribes to, logged at or after it, oldest first, at most ``MAX_REPLAY`` per call; the
answer's ``next_since`` continues) or of one event (``event_id``, whatever its type). Events are
kept ``CLARION_WEBHOOK_RETENTION_DAYS``.

What a replay may add is bounded: an event already pending for the endpoint is not queued again
(``replayed`` counts only what was added), and an endpoint holds at most ``MAX_REPLAY`` pending
replayed deliveries; a replay past that is a 409 until some are delivered. Before (2026-11-28, a
helper's probe), four loops replaying 400 events added 476,400 rows (151 MB) in 10 s.

Errors: ``ApiError`` 404 ``not_found`` (no such endpoint or event for this tenant), 409
``endpoint_disabled`` (enable it first), 409 ``replay_backlog`` (``MAX_REPLAY`` replays pending),
409 ``endpoint_busy`` (another replay, disable or delete of it in flight; ``Retry-After: 1``), 422
``validation_error``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated
from uuid import UUID

import sqlalchemy as sa
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.caps import took_alone
from api.errors import ApiError
from core.webhook_events import PARKED_AT
from schema.ids import uuid7_time

MAX_REPLAY = 10_000
_PARKED = datetime.fromisoformat(PARKED_AT)


def _aware(value: datetime | None) -> datetime | None:
    if value is not None and value.tzinfo is None:
        raise ValueError("give the time with its offset (2026-11-25T09:00:00Z)")
    return value


class ReplayIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: Annotated[datetime | None, AfterValidator(_aware)] = Field(
        default=None, description="replay every subscribed event logged at or after this time"
    )
    event_id: UUID | None = Field(default=None, description="replay this one event (its webhook-id)")

    @model_validator(mode="after")
    def _one_of(self) -> ReplayIn:
        if (self.since is None) == (self.event_id is None):
            raise ValueError("give exactly one of since and event_id")
        return self


class ReplayOut(BaseModel):
    replayed: int
    next_since: datetime | None = Field(
        description="more events remain: replay again from this time (null when all were queued)"
    )


class DeliveryOut(BaseModel):
    id: UUID
    event_id: UUID
    event_type: str
    state: str = Field(description="pending | delivered | failed | cancelled")
    attempts: int
    next_attempt_at: datetime | None = Field(
        description="when the next call is due (null: done, or parked while the endpoint is disabled)"
    )
    last_attempt_at: datetime | None
    last_status: int | None
    last_error: str | None
    delivered_at: datetime | None
    replay: bool
    created_at: datetime


# ``FOR KEY SHARE``, as an enqueue holds it (``core.webhook_events``): Clarion's disabling of the
# endpoint after a failure streak (``workers.webhook_record.park_queued``) waits for this replay to
# commit and parks what it queued, or this replay waits for that and finds the endpoint disabled.
# Before, a replay that read the endpoint enabled queued its events after the disable had parked
# (all due for a disabled endpoint). The tenant's own disable needs no row lock: ``hold_replays``.
_ENDPOINT = sa.text(
    "SELECT enabled, event_types FROM webhook_endpoints WHERE id = :e AND tenant_id = :t FOR KEY SHARE"
)
# Both read ix_webhook_deliveries_pending_endpoint (pending rows only, migration 0013).
_PENDING_REPLAYS = sa.text(
    """
    SELECT count(*) FROM (SELECT 1 FROM webhook_deliveries
                           WHERE endpoint_id = :e AND state = 'pending' AND replay LIMIT :limit) p
    """
)
# A delivery is never older than its event (made in the event's transaction, or by a replay
# since): the bound lets each probe skip the days before the event.
_NOT_PENDING = """
NOT EXISTS (SELECT 1 FROM webhook_deliveries d
             WHERE d.endpoint_id = CAST(:e AS uuid) AND d.event_id = {event}.id AND d.state = 'pending'
               AND d.created_at >= {event}.created_at)
"""
# The candidates are the next ``limit`` events whatever their state, so a call reads at most that
# many however many are pending already; those pending are then left out.
_REPLAY_SINCE = sa.text(
    f"""
    WITH candidates AS (
        SELECT id, type, body, created_at FROM webhook_events
         WHERE tenant_id = :t AND created_at >= :since AND type = ANY(:types)
         ORDER BY created_at, id LIMIT :limit
    ), queued AS (
        INSERT INTO webhook_deliveries (id, endpoint_id, tenant_id, event_id, event_type, body, replay)
        SELECT gen_random_uuid(), CAST(:e AS uuid), CAST(:t AS text), c.id, c.type, c.body, true
          FROM candidates c WHERE {_NOT_PENDING.format(event="c")}
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM queued) AS n, (SELECT count(*) FROM candidates) AS read,
           (SELECT max(created_at) FROM candidates) AS last
    """
)
_FIND_ONE = sa.text(
    f"""
    SELECT {_NOT_PENDING.format(event="webhook_events")} AS fresh FROM webhook_events
     WHERE tenant_id = :t AND id = :id AND created_at BETWEEN :lo AND :hi
    """
)
_REPLAY_ONE = sa.text(
    """
    INSERT INTO webhook_deliveries (id, endpoint_id, tenant_id, event_id, event_type, body, replay)
    SELECT gen_random_uuid(), CAST(:e AS uuid), CAST(:t AS text), id, type, body, true FROM webhook_events
     WHERE tenant_id = :t AND id = :id AND created_at BETWEEN :lo AND :hi
    """
)


async def hold_replays(conn: AsyncConnection, *, tenant_id: str, endpoint_id: UUID) -> None:
    """Keep any other replay, disable or delete of the endpoint out until ``conn``'s transaction
    ends, or raise ``ApiError`` 409 ``endpoint_busy`` at once when one is in flight. A replay reads
    its endpoint only once it holds this, and disabling or deleting the endpoint takes it too: so
    the park or cancel sees every delivery a replay queued, and a replay after it finds the
    endpoint disabled or gone. Before, a ``DELETE`` while a replay was queueing left its 10,000
    deliveries due for a deleted endpoint, which every claim of ``clarion webhooks`` then read past
    (``workers/webhook_claim.py``).

    Never waited for: each waiter held one of the API's pooled connections while the replay in
    flight ran for seconds. A helper's probe (2026-11-29), 40 replays of one endpoint at once,
    three times: another tenant's ``PUT /v1/users`` p99 25 ms alone, 6,351 ms under it (55
    requests served in 18.9 s against 447 in 5 s). The key names the tenant, so no tenant can hold
    another's endpoint busy by naming its id."""
    if not await took_alone(conn, kind="webhook-replay", key=f"{tenant_id}:{endpoint_id}"):
        raise ApiError(
            409, "endpoint_busy",
            "A replay of this endpoint, or a change to it, is in flight: try again in a moment.",
            headers={"Retry-After": "1"},
        )  # fmt: skip


async def replay(*, engine: AsyncEngine, tenant_id: str, endpoint_id: UUID, request: ReplayIn) -> ReplayOut:
    """Queue the events ``request`` names for the endpoint again (see the module docstring)."""
    async with engine.begin() as conn:
        # One replay of an endpoint at a time: the next one's statements see what this one queued.
        await hold_replays(conn, tenant_id=tenant_id, endpoint_id=endpoint_id)
        endpoint = (await conn.execute(_ENDPOINT, {"e": endpoint_id, "t": tenant_id})).first()
        if endpoint is None:
            raise ApiError(404, "not_found", f"No webhook endpoint {endpoint_id}.")
        if not endpoint.enabled:
            raise ApiError(409, "endpoint_disabled", "The endpoint is disabled: enable it, then replay.")
        pending = (await conn.execute(_PENDING_REPLAYS, {"e": endpoint_id, "limit": MAX_REPLAY})).scalar_one()
        room = MAX_REPLAY - pending
        if room <= 0:
            raise ApiError(
                409, "replay_backlog",
                f"The endpoint has {MAX_REPLAY} replayed deliveries pending: replay again once they are delivered.",
            )  # fmt: skip
        if request.event_id is not None:
            try:
                # The id is a UUIDv7: its time names the one to three daily partitions to search.
                at = uuid7_time(request.event_id)
                window = {"lo": at - timedelta(days=1), "hi": at + timedelta(days=1)}
            except (ValueError, OverflowError):  # a time no event has: past 9999 or at its edge
                raise ApiError(404, "not_found", f"No webhook event {request.event_id}.") from None
            params = {"e": endpoint_id, "t": tenant_id, "id": request.event_id}
            fresh = (await conn.execute(_FIND_ONE, params | window)).scalar_one_or_none()
            if fresh is None:
                raise ApiError(404, "not_found", f"No webhook event {request.event_id}.")
            if fresh:
                await conn.execute(_REPLAY_ONE, params | window)
            return ReplayOut(replayed=int(fresh), next_since=None)
        params = {"e": endpoint_id, "t": tenant_id, "since": request.since, "limit": room}
        row = (await conn.execute(_REPLAY_SINCE, params | {"types": list(endpoint.event_types)})).one()
    more = row.read >= room
    # Continue after the last one queued (created_at is microseconds; ties at that instant repeat).
    next_since = row.last + timedelta(microseconds=1) if more and row.last is not None else None
    return ReplayOut(replayed=row.n, next_since=next_since)


_DELIVERIES = sa.text(
    """
    SELECT d.id, d.event_id, d.event_type, d.state, d.attempts,
           CASE WHEN d.state = 'pending' AND d.next_attempt_at < :parked THEN d.next_attempt_at END
             AS next_attempt_at, d.last_attempt_at,
           d.last_status, d.last_error, d.delivered_at, d.replay, d.created_at
      FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id AND e.tenant_id = :t
     WHERE d.endpoint_id = :e
     ORDER BY d.created_at DESC, d.id LIMIT :limit
    """
)


async def recent_deliveries(
    *, engine: AsyncEngine, tenant_id: str, endpoint_id: UUID, limit: int
) -> list[DeliveryOut]:
    """The endpoint's newest deliveries with each one's last error (404 for another tenant's)."""
    async with engine.connect() as conn:
        if (await conn.execute(_ENDPOINT, {"e": endpoint_id, "t": tenant_id})).first() is None:
            raise ApiError(404, "not_found", f"No webhook endpoint {endpoint_id}.")
        params = {"e": endpoint_id, "t": tenant_id, "limit": limit, "parked": _PARKED}
        rows = (await conn.execute(_DELIVERIES, params)).all()
    return [DeliveryOut(**row._mapping) for row in rows]
