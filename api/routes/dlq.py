"""Operators: the dead-letter queue per channel (``GET``) and its redrive (``POST``, admin scope).

A tenant's key sees and redrives that tenant's dead notifications only. A redrive is charged to
the tenant's ``tenant`` rule (`api.tenant_budget`): it requeues what the budget admits now, and
``remaining`` says what is left for a later call.
"""

from __future__ import annotations

import math
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.ext.asyncio import AsyncEngine

from api.auth import require
from api.dlq import (
    MAX_REDRIVE_PER_CALL,
    DeadLetterPage,
    RedriveFilter,
    RedriveResult,
    count_dead,
    list_dead,
    redrive,
)
from api.errors import ApiError
from api.ingress import IngressLimits
from api.openapi_doc import NO_NUL
from api.tenant_budget import take
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
    engine = request.app.state.engine
    limit = await _budget(request, principal.tenant_id, engine=engine, channel=channel, match=match)
    result = await redrive(
        engine=engine,
        publisher=request.app.state.publisher,
        tenant_id=principal.tenant_id,
        channel=channel,
        match=match,
        limit=limit,
    )
    metrics.REDRIVEN.labels(channel.value).inc(result.requeued)
    return result


async def _budget(
    request: Request, tenant_id: str, *, engine: AsyncEngine, channel: Channel, match: RedriveFilter
) -> int:
    """How many this call may requeue: at most ``MAX_REDRIVE_PER_CALL``, and no more than the
    tenant's budget admits now (`api.tenant_budget`); a 429 when it admits none of those waiting."""
    ingress: IngressLimits = request.app.state.ingress
    rules = await ingress.rules.current()
    if not rules.for_tenant("tenant", tenant_id):
        return MAX_REDRIVE_PER_CALL
    dead = await count_dead(
        engine=engine, tenant_id=tenant_id, channel=channel, match=match, at_most=MAX_REDRIVE_PER_CALL
    )
    if dead == 0:
        return MAX_REDRIVE_PER_CALL  # nothing to requeue, nothing charged
    grant = await take(limiter=ingress.limiter, rules=rules, tenant_id=tenant_id, wanted=dead)
    if grant is None:
        return MAX_REDRIVE_PER_CALL
    if grant.admitted == 0:
        retry_after_s = max(1, math.ceil(grant.after_s(1)))
        spec = grant.holding(1)
        raise ApiError(
            429,
            "rate_limited",
            f"A redrive is charged to the tenant rate limit '{spec.label}' ({spec.limit} per "
            f"{spec.period_s:g}s), which has no room now; retry after {retry_after_s}s.",
            {"rule": spec.label, "scope": spec.scope, "retry_after_s": retry_after_s},
            headers={"Retry-After": str(retry_after_s)},
        )
    return grant.admitted
