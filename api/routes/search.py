"""GET /v1/notifications: search the caller's notifications, newest first, cursor-paginated.

The cursor is opaque to callers (the last item's ``created_at`` in microseconds since the epoch and
its id: ``CURSOR_PATTERN``, so the OpenAPI document states exactly which cursors are accepted);
pages are stable while new notifications arrive because they only ever sort before the cursor.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any
from uuid import UUID

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncEngine

from api.auth import require
from api.errors import ApiError
from api.json_types import IsoDatetime
from api.models import ErrorInfo
from api.openapi_doc import NO_NUL
from api.search_limit import SearchLimit
from clarion.tenants import Principal
from schema.enums import Channel, Priority, Status
from schema.log_models import Notification
from schema.models import User
from schema.shown_status import shown_status_column, status_filter

router = APIRouter(prefix="/v1/notifications", tags=["notifications"])

MAX_LIMIT = 200
_n = Notification.__table__  # type: ignore[attr-defined]
_u = User.__table__  # type: ignore[attr-defined]


class NotificationSummary(BaseModel):
    id: UUID
    event_id: str
    user_id: str
    channel: Channel
    category: str
    priority: Priority
    status: str
    attempts: int
    provider: str | None
    error: ErrorInfo | None
    created_at: datetime
    updated_at: datetime


class NotificationPage(BaseModel):
    items: list[NotificationSummary]
    next_cursor: str | None = None


# At most 17 digits: 10**17 microseconds is the year 5138, inside what datetime can hold, so every
# string matching the pattern decodes (the route's Query enforces it before any decoding).
CURSOR_PATTERN = r"^[0-9]{1,17}\.[0-9a-f]{32}$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def encode_cursor(created_at: datetime, notification_id: UUID) -> str:
    return f"{(_aware(created_at) - _EPOCH) // _MICROSECOND}.{notification_id.hex}"  # type: ignore[operator]


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """(created_at, id) from a cursor matching ``CURSOR_PATTERN``; ``ApiError`` 422 for anything else."""
    micros, dot, nid = cursor.partition(".")
    try:
        if not dot or not micros.isdigit() or len(micros) > 17:
            raise ValueError(cursor)
        return _EPOCH + int(micros) * _MICROSECOND, UUID(hex=nid)
    except ValueError as exc:
        raise ApiError(
            422, "invalid_cursor", "The cursor is not one this API issued; start again without it."
        ) from exc


def _aware(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


async def search_notifications(
    *,
    engine: AsyncEngine,
    searches: SearchLimit,
    tenant_id: str,
    user: str | None = None,
    statuses: list[Status] | None = None,
    channel: Channel | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    cursor: str | None = None,
    limit: int = 50,
) -> NotificationPage:
    """One page of ``tenant_id``'s notifications matching every filter given, newest first.

    ``since`` is inclusive, ``until`` exclusive (naive times are UTC). Another tenant's
    notifications never match, whatever the filters. ``searches`` bounds how many run at once per
    tenant and for how long (``api/search_limit.py``: 429 ``too_many_searches``, 422
    ``search_too_broad``).
    """
    since, until = _aware(since), _aware(until)
    if since is not None and until is not None and since >= until:
        raise ApiError(422, "validation_error", "since must be earlier than until.", [{"field": "since"}])
    query = (
        sa.select(
            _n.c.id,
            _n.c.event_id,
            _u.c.external_id,
            _n.c.channel,
            _n.c.category,
            _n.c.priority,
            shown_status_column(_n).label("status"),
            _n.c.attempts,
            _n.c.provider,
            _n.c.error_code,
            _n.c.error_message,
            _n.c.created_at,
            _n.c.updated_at,
        )
        .join(_u, _u.c.id == _n.c.user_id)
        .where(_n.c.tenant_id == tenant_id)
        .order_by(_n.c.created_at.desc(), _n.c.id.desc())
        .limit(limit + 1)
    )
    if user is not None:
        query = query.where(_u.c.tenant_id == tenant_id, _u.c.external_id == user)
    if statuses:
        query = query.where(status_filter(_n, statuses))
    if channel is not None:
        query = query.where(_n.c.channel == channel.value)
    if since is not None:
        query = query.where(_n.c.created_at >= since)
    if until is not None:
        query = query.where(_n.c.created_at < until)
    if cursor is not None:
        created, nid = decode_cursor(cursor)
        query = query.where(
            sa.tuple_(_n.c.created_at, _n.c.id) < sa.tuple_(sa.literal(created), sa.literal(nid))
        )
    async with searches.connect(engine=engine, tenant_id=tenant_id) as conn:
        rows = (await conn.execute(query)).all()
    items = [_summary(r) for r in rows[:limit]]
    more = len(rows) > limit
    return NotificationPage(
        items=items, next_cursor=encode_cursor(items[-1].created_at, items[-1].id) if more else None
    )


def _summary(row: Any) -> NotificationSummary:
    return NotificationSummary(
        id=row.id,
        event_id=row.event_id,
        user_id=row.external_id,
        channel=row.channel,
        category=row.category,
        priority=row.priority,
        status=row.status,
        attempts=row.attempts,
        provider=row.provider,
        error=ErrorInfo(code=row.error_code, message=row.error_message) if row.error_code else None,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


@router.get("", response_model=NotificationPage)
async def search(
    request: Request,
    principal: Annotated[Principal, Depends(require("read"))],
    user: Annotated[
        str | None, Query(max_length=255, pattern=NO_NUL, description="the user's external id")
    ] = None,
    status: Annotated[list[Status] | None, Query(description="repeat for several")] = None,
    channel: Channel | None = None,
    since: Annotated[IsoDatetime | None, Query(description="created at or after (ISO 8601)")] = None,
    until: Annotated[IsoDatetime | None, Query(description="created before (ISO 8601)")] = None,
    cursor: Annotated[
        str | None,
        Query(max_length=50, pattern=CURSOR_PATTERN, description="next_cursor of the previous page"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 50,
) -> NotificationPage:
    return await search_notifications(
        engine=request.app.state.engine,
        searches=request.app.state.searches,
        tenant_id=principal.tenant_id,
        user=user,
        statuses=status,
        channel=channel,
        since=since,
        until=until,
        cursor=cursor,
        limit=limit,
    )
