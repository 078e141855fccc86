"""/v1/notifications: send, read."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from api.accept import Send
from api.auth import require
from api.batch import accept_batch
from api.errors import ApiError
from api.ingress import enforce_ingress, ingress_limit
from api.lifecycle import cancel_notification
from api.models import Accepted, BatchIn, BatchOut, Cancelled, NotificationIn, NotificationOut
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
    body: NotificationIn,
    request: Request,
    principal: Annotated[Principal, Depends(require("send"))],
    _: Annotated[None, Depends(ingress_limit)],
) -> JSONResponse:
    state = request.app.state
    result = await state.accepts.accept(Send.of(principal, body))
    if result.message is not None:
        state.outbox.submit(result.message)
    if not result.duplicate:
        metrics.ACCEPTED.labels(principal.tenant_id, body.channel.value).inc()
    payload = Accepted(id=result.id, status=result.status, duplicate=result.duplicate)
    return JSONResponse(payload.model_dump(mode="json"), status_code=200 if result.duplicate else 202)


@router.post("/batch", status_code=202, response_model=BatchOut)
async def send_batch(
    body: BatchIn, request: Request, principal: Annotated[Principal, Depends(require("send"))]
) -> BatchOut:
    """Up to 1,000 sends; each item is accepted or refused on its own (see ``results``)."""
    await enforce_ingress(request=request, principal=principal, cost=len(body.notifications))
    state = request.app.state
    results = await accept_batch(
        pool=state.pool, renderer=state.renderer, principal=principal, items=body.notifications
    )
    for _, accepted in results:
        if accepted is not None and accepted.message is not None:
            state.outbox.submit(accepted.message)
            metrics.ACCEPTED.labels(principal.tenant_id, accepted.message.channel.value).inc()
    items = [out for out, _ in results]
    return BatchOut(
        accepted=sum(1 for i in items if i.error is None and not i.duplicate),
        duplicates=sum(1 for i in items if i.duplicate),
        rejected=sum(1 for i in items if i.error is not None),
        results=items,
    )


@router.post("/{notification_id}/cancel", response_model=Cancelled)
async def cancel(
    notification_id: UUID, request: Request, principal: Annotated[Principal, Depends(require("send"))]
) -> Cancelled:
    """Cancel a notification no worker is sending yet (409 once it is being sent or finished)."""
    status = await cancel_notification(
        pool=request.app.state.pool, tenant_id=principal.tenant_id, notification_id=notification_id
    )
    return Cancelled(id=notification_id, status=status)


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
