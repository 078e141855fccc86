"""Operators: the dead-letter queue per channel (``GET``) and its redrive (``POST``, admin scope).

A tenant's key sees and redrives that tenant's dead notifications only.
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request

from api.auth import require
from api.dlq import MAX_REDRIVE_PER_CALL, DeadLetterPage, RedriveFilter, RedriveResult, list_dead, redrive
from api.errors import ApiError
from api.openapi_doc import NO_NUL
from clarion import metrics
from clarion.tenants import Principal
from schema.enums import Channel

router = APIRouter(prefix="/v1/ops/dlq", tags=["operations"])


@router.get("/{channel}", response_model=DeadLetterPage)
async def dead_letters(
    channel: Channel,
    request: Request,
    principal: Annotated[Principal, Depends(require("read"))],
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: UUID | None = None,
    error_code: Annotated[str | None, Query(max_length=64, pattern=NO_NUL)] = None,
    provider: Annotated[str | None, Query(max_length=32, pattern=NO_NUL)] = None,
) -> DeadLetterPage:
    return await list_dead(
        engine=request.app.state.engine,
        tenant_id=principal.tenant_id,
        channel=channel,
        match=RedriveFilter(error_code=error_code, provider=provider),
        limit=limit,
        cursor=cursor,
        searches=request.app.state.searches,
    )


@router.post("/{channel}/redrive", response_model=RedriveResult)
async def redrive_dead_letters(
    channel: Channel,
    request: Request,
    principal: Annotated[Principal, Depends(require("admin"))],
    body: RedriveFilter | None = None,
) -> RedriveResult:
    match = body or RedriveFilter()
    if match.since is not None and match.until is not None and match.since >= match.until:
        raise ApiError(422, "validation_error", "'since' must be before 'until'.", {"field": "since"})
    result = await redrive(
        engine=request.app.state.engine,
        publisher=request.app.state.publisher,
        tenant_id=principal.tenant_id,
        channel=channel,
        match=match,
        limit=MAX_REDRIVE_PER_CALL,
    )
    metrics.REDRIVEN.labels(channel.value).inc(result.requeued)
    return result
