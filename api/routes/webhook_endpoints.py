"""/v1/webhook-endpoints: the tenant's outbound webhook endpoints (admin scope).

What an endpoint receives and how it verifies it: ``core.webhook_events``, ``core.webhook_signing``;
which URLs are refused: ``core.ssrf``.
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request, Response

from api.auth import require
from api.webhook_endpoints import (
    CreatedEndpoint,
    EndpointIn,
    EndpointOut,
    EndpointPatch,
    RotatedSecret,
    create_endpoint,
    delete_endpoint,
    get_endpoint,
    list_endpoints,
    rotate_secret,
    update_endpoint,
)
from api.webhook_replay import DeliveryOut, ReplayIn, ReplayOut, recent_deliveries, replay
from clarion.tenants import Principal
from core import ssrf

router = APIRouter(prefix="/v1/webhook-endpoints", tags=["webhook endpoints"])
Admin = Annotated[Principal, Depends(require("admin"))]


def _allow(request: Request) -> ssrf.AllowList:
    return ssrf.AllowList.parse(request.app.state.settings.webhook_allow_hosts)


@router.post("", status_code=201, response_model=CreatedEndpoint)
async def create(body: EndpointIn, request: Request, principal: Admin) -> CreatedEndpoint:
    """Register an endpoint. Its signing secret is in this response only: store it now."""
    settings = request.app.state.settings
    return await create_endpoint(
        engine=request.app.state.engine,
        tenant_id=principal.tenant_id,
        endpoint=body,
        allow=_allow(request),
        max_endpoints=settings.max_webhook_endpoints_per_tenant,
    )


@router.get("", response_model=list[EndpointOut])
async def index(request: Request, principal: Admin) -> list[EndpointOut]:
    return await list_endpoints(engine=request.app.state.engine, tenant_id=principal.tenant_id)


@router.get("/{endpoint_id}", response_model=EndpointOut)
async def read(endpoint_id: UUID, request: Request, principal: Admin) -> EndpointOut:
    """The endpoint, with ``disabled_reason`` when Clarion disabled it after a failure streak."""
    return await get_endpoint(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, endpoint_id=endpoint_id
    )


@router.patch("/{endpoint_id}", response_model=EndpointOut)
async def change(endpoint_id: UUID, body: EndpointPatch, request: Request, principal: Admin) -> EndpointOut:
    return await update_endpoint(
        engine=request.app.state.engine,
        tenant_id=principal.tenant_id,
        endpoint_id=endpoint_id,
        patch=body,
        allow=_allow(request),
    )


@router.delete("/{endpoint_id}", status_code=204)
async def delete(endpoint_id: UUID, request: Request, principal: Admin) -> Response:
    await delete_endpoint(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, endpoint_id=endpoint_id
    )
    return Response(status_code=204)


@router.post("/{endpoint_id}/rotate-secret", response_model=RotatedSecret)
async def rotate(endpoint_id: UUID, request: Request, principal: Admin) -> RotatedSecret:
    """A new secret (shown once); payloads carry both signatures for 24 hours."""
    return await rotate_secret(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, endpoint_id=endpoint_id
    )


@router.post("/{endpoint_id}/replay", status_code=202, response_model=ReplayOut)
async def replay_events(endpoint_id: UUID, body: ReplayIn, request: Request, principal: Admin) -> ReplayOut:
    """Send logged events again: ``{"since": time}`` or ``{"event_id": id}``."""
    return await replay(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, endpoint_id=endpoint_id, request=body
    )


@router.get("/{endpoint_id}/deliveries", response_model=list[DeliveryOut])
async def deliveries(
    endpoint_id: UUID, request: Request, principal: Admin, limit: Annotated[int, Query(ge=1, le=200)] = 50
) -> list[DeliveryOut]:
    """The newest deliveries to the endpoint, each with its state, calls and last error."""
    return await recent_deliveries(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, endpoint_id=endpoint_id, limit=limit
    )
