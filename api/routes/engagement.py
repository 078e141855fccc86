"""Engagement reported to Clarion: ``POST /v1/notifications/{id}/events`` (a tenant's backend, API key
with the ``send`` scope) and ``POST /v1/device/events`` (a device, holding the token its push
carried in ``clarion_event_token``: no API key on devices). Both idempotent (``api.engagement``).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fastapi import APIRouter, Request

from api.auth import authorize
from api.engagement import device_claims, report_engagement
from api.engagement_models import DeviceEngagementIn, EngagementIn, EngagementRecorded
from api.openapi_doc import KEYED
from api.routes.notifications import parse_body, require_json
from clarion.settings import Settings

router = APIRouter(tags=["engagement"])

DEVICE_EVENTS_PATH = "/v1/device/events"


def _body_doc(model: type[Any], *, keyed: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }
    if keyed:
        doc[KEYED] = True
    return doc


@router.post(
    "/v1/notifications/{notification_id}/events",
    response_model=EngagementRecorded,
    openapi_extra=_body_doc(EngagementIn, keyed=True),
)
async def report(notification_id: UUID, request: Request) -> EngagementRecorded:
    """Report that a person opened the notification or clicked a link in it (e.g. a push open your
    app saw); the same report again changes nothing (``duplicate``)."""
    principal = await authorize(request, "send")  # before the body is read
    require_json(request)
    body = parse_body(await request.body(), EngagementIn)
    return await report_engagement(
        pool=request.app.state.pool,
        gate=request.app.state.engagement_gate,
        tenant_id=principal.tenant_id,
        notification_id=notification_id,
        report=body,
        source="api",
    )


@router.post(
    DEVICE_EVENTS_PATH,
    response_model=EngagementRecorded,
    openapi_extra=_body_doc(DeviceEngagementIn, keyed=False),
)
async def report_from_device(request: Request) -> EngagementRecorded:
    """A device reports an open or click of a push, authenticated by the push's
    ``clarion_event_token`` (no API key); the same report again changes nothing (``duplicate``)."""
    require_json(request)
    body = parse_body(await request.body(), DeviceEngagementIn)
    settings: Settings = request.app.state.settings
    secrets = [settings.secret_key.get_secret_value()]
    secrets += [s.get_secret_value() for s in settings.previous_secret_keys]
    tenant_id, notification_id = device_claims(token=body.token, secrets=secrets)
    return await report_engagement(
        pool=request.app.state.pool,
        gate=request.app.state.engagement_gate,
        tenant_id=tenant_id,
        notification_id=notification_id,
        report=body,
        source="device",
    )
