"""``GET /v1/analytics``: counts and rates per template, channel, category and provider over time."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response

from api.analytics import DIMENSIONS, MAX_PAGE, AnalyticsPage, parse_group_by, read_analytics
from api.analytics_cursor import CURSOR_PATTERN
from api.auth import require
from api.json_types import IsoAwareDatetime
from api.openapi_doc import NO_NUL
from clarion.tenants import Principal
from schema.enums import Channel

router = APIRouter(prefix="/v1/analytics", tags=["analytics"])


@router.get("", response_model=AnalyticsPage)
async def analytics(
    request: Request,
    principal: Annotated[Principal, Depends(require("read"))],
    since: Annotated[
        IsoAwareDatetime | None,
        Query(description="from (inclusive, ISO 8601 with a zone); default: 7 days ago, or the cursor's"),
    ] = None,
    until: Annotated[
        IsoAwareDatetime | None, Query(description="to (exclusive); default: now, or the cursor's")
    ] = None,
    interval: Literal["hour", "day"] = "day",
    group_by: Annotated[
        str | None,
        Query(
            max_length=100,
            pattern=r"^[a-z_,]*$",
            description=f"comma-separated, any of: {', '.join(DIMENSIONS)}",
        ),
    ] = None,
    channel: Channel | None = None,
    template: Annotated[str | None, Query(max_length=128, pattern=NO_NUL)] = None,
    category: Annotated[str | None, Query(max_length=64, pattern=NO_NUL)] = None,
    cursor: Annotated[
        str | None,
        Query(max_length=2823, pattern=CURSOR_PATTERN, description="a page's `next_cursor`"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="rows per page")] = MAX_PAGE,
) -> Response:
    """Accepted, sent, failed, suppressed, delivered, bounced, opened, clicked, unsubscribed and
    complained counts with their rates, per hour or day, from rollups kept as events arrive; a
    page of at most `limit` rows, and `next_cursor` for the next one (null on the last)."""
    answer = await read_analytics(
        engine=request.app.state.engine,
        searches=request.app.state.searches,
        cursor_secret=request.app.state.settings.secret_key.get_secret_value().encode(),
        tenant_id=principal.tenant_id,
        since=since,
        until=until,
        interval=interval,
        group_by=parse_group_by(group_by),
        channel=channel.value if channel else None,
        template=template,
        category=category,
        cursor=cursor,
        limit=limit,
    )
    # Sent as built: the response_model is the document's, not a second validation of every row.
    return Response(answer.json(), media_type="application/json")
