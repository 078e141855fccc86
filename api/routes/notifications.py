"""/v1/notifications: send, read."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from api.accept import accept_notification
from api.auth import require
from api.errors import ApiError
from api.models import Accepted, NotificationIn, NotificationOut
from api.queries import get_notification
from clarion import metrics
from clarion.tenants import Principal

router = APIRouter(prefix="/v1/notifications", tags=["notifications"])


@router.post(
    "",
    status_code=202,
    response_model=Accepted,
    responses={200: {"model": Accepted, "description": "a repeat of an event_id already accepted"}},
)
async def send(
    body: NotificationIn, request: Request, principal: Annotated[Principal, Depends(require("send"))]
) -> JSONResponse:
    state = request.app.state
    result = await accept_notification(
        engine=state.engine, renderer=state.renderer, principal=principal, req=body
    )
    if result.message is not None:
        state.outbox.submit(result.message)
    if not result.duplicate:
        metrics.ACCEPTED.labels(principal.tenant_id, body.channel.value).inc()
    payload = Accepted(id=result.id, status=result.status, duplicate=result.duplicate)
    return JSONResponse(payload.model_dump(mode="json"), status_code=200 if result.duplicate else 202)


@router.get("/{notification_id}", response_model=NotificationOut)
async def read(
    notification_id: UUID, request: Request, principal: Annotated[Principal, Depends(require("read"))]
) -> NotificationOut:
    found = await get_notification(
        request.app.state.engine, tenant_id=principal.tenant_id, notification_id=notification_id
    )
    if found is None:
        raise ApiError(404, "not_found", f"No notification {notification_id}.")
    return found
