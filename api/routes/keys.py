"""/v1/keys: the caller's tenant's API keys (admin scope)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from api.auth import require
from api.errors import ApiError
from api.keys import CreatedKey, KeyIn, KeyOut, create_key, list_keys, revoke_key
from clarion.tenants import Principal

router = APIRouter(prefix="/v1/keys", tags=["api keys"])
Admin = Annotated[Principal, Depends(require("admin"))]
KeyId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9]+$")]


@router.post("", status_code=201, response_model=CreatedKey)
async def create(body: KeyIn, request: Request, principal: Admin) -> CreatedKey:
    """Create a key for your tenant. The full key is in this response only: store it now."""
    return await create_key(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, name=body.name, scopes=body.scopes,
        max_keys=request.app.state.settings.max_api_keys_per_tenant,
    )  # fmt: skip


@router.get("", response_model=list[KeyOut])
async def list_all(request: Request, principal: Admin) -> list[KeyOut]:
    """Your tenant's unrevoked keys and its 100 most recently revoked ones (ids, names, scopes,
    dates); secrets are never shown again."""
    return await list_keys(engine=request.app.state.engine, tenant_id=principal.tenant_id)


@router.post("/{key_id}/revoke", response_model=KeyOut)
async def revoke(key_id: KeyId, request: Request, principal: Admin) -> KeyOut:
    """Revoke one of your tenant's keys; every API process refuses it within 5 seconds. The key
    making the request cannot revoke itself (``409 revoking_own_key``): rotate by creating a new
    key and revoking the old one with it, so no caller locks its tenant out by mistake."""
    if key_id == principal.key_id:
        raise ApiError(
            409, "revoking_own_key", "A key cannot revoke itself; revoke it with another admin key."
        )
    return await revoke_key(engine=request.app.state.engine, tenant_id=principal.tenant_id, key_id=key_id)
