"""/v1/rate-limits (rule CRUD) and /v1/tenant/settings (content-dedupe window); admin scope.

What each rule field means and which combinations are valid: see `api.rate_limits`; the settings:
`api.tenant_settings`.
"""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Request, Response

from api.auth import require
from api.rate_limits import (
    RateLimitIn,
    RateLimitOut,
    create_rule,
    delete_rule,
    get_rule,
    list_rules,
    replace_rule,
)
from api.tenant_settings import (
    TenantSettingsIn,
    TenantSettingsOut,
    get_tenant_settings,
    update_tenant_settings,
)
from clarion.tenants import Principal

router = APIRouter(tags=["rate limits"])
Admin = Annotated[Principal, Depends(require("admin"))]


@router.post("/v1/rate-limits", status_code=201, response_model=RateLimitOut)
async def create(body: RateLimitIn, request: Request, principal: Admin) -> RateLimitOut:
    return await create_rule(
        engine=request.app.state.engine,
        tenant_id=principal.tenant_id,
        rule=body,
        max_rules=request.app.state.settings.max_rules_per_tenant,
    )


@router.get("/v1/rate-limits", response_model=list[RateLimitOut])
async def index(request: Request, principal: Admin) -> list[RateLimitOut]:
    return await list_rules(engine=request.app.state.engine, tenant_id=principal.tenant_id)


@router.get("/v1/rate-limits/{rule_id}", response_model=RateLimitOut)
async def read(rule_id: UUID, request: Request, principal: Admin) -> RateLimitOut:
    return await get_rule(engine=request.app.state.engine, tenant_id=principal.tenant_id, rule_id=rule_id)


@router.put("/v1/rate-limits/{rule_id}", response_model=RateLimitOut)
async def replace(rule_id: UUID, body: RateLimitIn, request: Request, principal: Admin) -> RateLimitOut:
    return await replace_rule(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, rule_id=rule_id, rule=body
    )


@router.delete("/v1/rate-limits/{rule_id}", status_code=204)
async def delete(rule_id: UUID, request: Request, principal: Admin) -> Response:
    await delete_rule(engine=request.app.state.engine, tenant_id=principal.tenant_id, rule_id=rule_id)
    return Response(status_code=204)


@router.get("/v1/tenant/settings", response_model=TenantSettingsOut)
async def read_settings(request: Request, principal: Admin) -> TenantSettingsOut:
    return await get_tenant_settings(engine=request.app.state.engine, tenant_id=principal.tenant_id)


@router.put("/v1/tenant/settings", response_model=TenantSettingsOut)
async def replace_settings(body: TenantSettingsIn, request: Request, principal: Admin) -> TenantSettingsOut:
    return await update_tenant_settings(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, settings=body
    )
