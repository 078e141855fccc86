"""/v1/notifications: send, read."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar
from uuid import UUID

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from api.auth import authorize, require
from api.batch import accept_batch
from api.errors import ApiError, validation_error
from api.ingress import enforce_ingress
from api.lifecycle import cancel_notification
from api.models import Accepted, BatchIn, BatchOut, Cancelled, NotificationIn, NotificationOut
from api.openapi_doc import KEYED
from api.queries import get_notification
from api.submission import Submission
from clarion import metrics, tracing
from clarion.tenants import Principal

M = TypeVar("M", bound=BaseModel)

router = APIRouter(prefix="/v1/notifications", tags=["notifications"])


# The hot route reads and validates its body itself (pydantic straight from the JSON bytes, after
# authentication and the ingress limit, as the dependencies would order it): FastAPI's dependency
# and body machinery cost more CPU per send than the group-committed accept. The body is still
# documented in the OpenAPI schema (``api.app`` adds NotificationIn to its components).
SEND_BODY_DOC: dict[str, Any] = {
    KEYED: True,
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NotificationIn"}}},
    },
}
BATCH_BODY_DOC: dict[str, Any] = {
    KEYED: True,
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/BatchIn"}}},
    },
}


def require_json(request: Request) -> None:
    """415 for a body that says it is something other than JSON (a missing type is taken as JSON)."""
    media = request.headers.get("content-type", "application/json").split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise ApiError(
            415, "unsupported_media_type", "Send the body as JSON (Content-Type: application/json)."
        )


# How the JSON parser (jiter) names a \\ud800-\\udfff escape with no partner.
_SURROGATE = re.compile(r"surrogate|end of hex escape")


def parse_body(raw: bytes, model: type[M]) -> M:
    """``model`` from a JSON body: 400 ``malformed_json`` for bytes that are not JSON, 422
    ``validation_error`` naming every bad field."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if any(e["type"] == "json_invalid" and _SURROGATE.search(str(e.get("ctx", ""))) for e in errors):
            raise ApiError(
                422,
                "invalid_text",
                "The request holds a lone UTF-16 surrogate (like \\ud800): no provider can carry it.",
            ) from None
        if any(e["type"] == "json_invalid" for e in errors):
            raise ApiError(400, "malformed_json", "The request body is not valid JSON.") from None
        raise validation_error(errors) from None


def parse_batch(raw: bytes) -> BatchIn:
    """The batch's body as :func:`parse_body` reads it, except that a lone surrogate refuses only
    the items holding it (one bad item never sinks the rest, ``api/batch.py``). The JSON parser
    pydantic uses refuses the whole document for one; Python's ``json`` reads it into text, and each
    item's own validation (``check_text_tree``) then refuses the items that hold it."""
    try:
        return parse_body(raw, BatchIn)
    except ApiError as exc:
        if exc.code != "invalid_text":
            raise
    try:
        document = json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # RecursionError: nested past the interpreter's limit
        raise ApiError(400, "malformed_json", "The request body is not valid JSON.") from None
    try:
        return BatchIn.model_validate(document)
    except ValidationError as exc:
        raise validation_error(exc.errors(include_url=False)) from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")  # Python's json reads NaN and Infinity; JSON has neither


@router.post(
    "",
    status_code=202,
    response_model=Accepted,
    responses={200: {"model": Accepted, "description": "a repeat of an event_id already accepted"}},
    openapi_extra=SEND_BODY_DOC,
)
async def send(request: Request) -> JSONResponse:
    """Accept one notification (``202``); a repeat of an accepted event_id answers ``200``."""
    if not tracing.enabled:
        return await _send(request, None)
    with accept_span(request) as span:
        response = await _send(request, span)
        span.set("http.response.status_code", response.status_code)
        return response


async def _send(request: Request, span: tracing.SpanRef | None) -> JSONResponse:
    # The caller is known before its body is read: an unauthenticated request costs no body buffer.
    principal = await authorize(request, "send")
    require_json(request)
    await enforce_ingress(request=request, principal=principal, cost=1)
    body = parse_body(await request.body(), NotificationIn)
    state = request.app.state
    traceparent = span.traceparent if span is not None else None
    result = await state.accepts.accept(Submission.of(principal, body, traceparent=traceparent))
    if result.message is not None:
        state.outbox.submit(result.message)
    if not result.duplicate:
        metrics.ACCEPTED.labels(principal.tenant_id, body.channel.value).inc()
    if span is not None:
        span.set("clarion.notification_id", str(result.id))
        span.set("clarion.channel", body.channel.value)
        span.set("clarion.duplicate", result.duplicate)
    payload = Accepted(id=result.id, status=result.status, duplicate=result.duplicate)
    return JSONResponse(payload.model_dump(mode="json"), status_code=200 if result.duplicate else 202)


@contextmanager
def accept_span(request: Request) -> Iterator[tracing.SpanRef]:
    """The ``clarion.accept`` span of a request: a child of the caller's ``traceparent`` when it is
    valid (anything else starts a new trace, never an error). A refusal (``ApiError``) is kept as
    its status and code; only a 5xx marks the span failed, as for any HTTP server span."""
    refused: ApiError | None = None
    parent = request.headers.get(tracing.HEADER)
    attributes = {"http.request.method": "POST", "http.route": request.scope["path"]}
    with tracing.span("clarion.accept", parent=parent, kind="server", attributes=attributes) as span:
        try:
            yield span
        except ApiError as exc:
            span.set("http.response.status_code", exc.status)
            span.set("clarion.error_code", exc.code)
            if exc.status >= 500:
                span.fail(exc.code)
            refused = exc
    if refused is not None:
        raise refused


@router.post("/batch", status_code=202, response_model=BatchOut, openapi_extra=BATCH_BODY_DOC)
async def send_batch(request: Request) -> BatchOut:
    """Up to 1,000 sends; each item is accepted or refused on its own (see ``results``)."""
    if not tracing.enabled:
        return await _send_batch(request, None)
    with accept_span(request) as span:
        out = await _send_batch(request, span)
        span.set("http.response.status_code", 202)
        span.set("clarion.accepted", out.accepted)
        return out


async def _send_batch(request: Request, span: tracing.SpanRef | None) -> BatchOut:
    principal = await authorize(request, "send")  # before the (up to several MB) body is read
    require_json(request)
    body = parse_batch(await request.body())
    await enforce_ingress(request=request, principal=principal, cost=len(body.notifications))
    state = request.app.state
    results = await accept_batch(
        pool=state.pool,
        renderer=state.renderer,
        counts=state.accepted_counts,
        principal=principal,
        items=body.notifications,
        traceparent=span.traceparent if span is not None else None,
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
