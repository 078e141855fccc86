"""/v1/users: profiles (contact details, locale, timezone, quiet hours) and push devices."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import JSONResponse

from api.auth import require
from api.openapi_doc import NO_NUL
from api.users import DeviceIn, DeviceOut, UserOut, UserProfileIn, get_user, put_user, register_device
from api.users import remove_device as remove_device_service
from clarion.tenants import Principal

router = APIRouter(prefix="/v1/users", tags=["users"])

ExternalId = Annotated[
    str,
    Path(
        min_length=1,
        max_length=255,
        pattern=NO_NUL,
        description="your id for the user (a new one: printable characters only, no whitespace at either end)",
    ),
]


@router.put(
    "/{external_id}",
    response_model=UserOut,
    responses={201: {"model": UserOut, "description": "the user was created"}},
)
async def put(
    external_id: ExternalId,
    body: UserProfileIn,
    request: Request,
    principal: Annotated[Principal, Depends(require("send"))],
) -> JSONResponse:
    user, created = await put_user(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, external_id=external_id, profile=body
    )
    if "read" not in principal.scopes and "admin" not in principal.scopes:
        # A send-only key writes profiles; reading the user's device tokens needs 'read'.
        user = user.model_copy(update={"devices": []})
    return JSONResponse(user.model_dump(mode="json"), status_code=201 if created else 200)


@router.get("/{external_id}", response_model=UserOut)
async def read(
    external_id: ExternalId, request: Request, principal: Annotated[Principal, Depends(require("read"))]
) -> UserOut:
    return await get_user(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, external_id=external_id
    )


@router.post(
    "/{external_id}/devices",
    response_model=DeviceOut,
    responses={201: {"model": DeviceOut, "description": "a new device"}},
)
async def add_device(
    external_id: ExternalId,
    body: DeviceIn,
    request: Request,
    principal: Annotated[Principal, Depends(require("send"))],
) -> JSONResponse:
    device, created = await register_device(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, external_id=external_id, device=body
    )
    return JSONResponse(device.model_dump(mode="json"), status_code=201 if created else 200)


@router.delete("/{external_id}/devices/{token}", status_code=204)
async def remove_device(
    external_id: ExternalId,
    token: Annotated[str, Path(min_length=1, max_length=4096, pattern=NO_NUL)],
    request: Request,
    principal: Annotated[Principal, Depends(require("send"))],
) -> Response:
    await remove_device_service(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, external_id=external_id, token=token
    )
    return Response(status_code=204)
