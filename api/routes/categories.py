"""/v1/categories: the tenant's notification categories (default opt-in, required, email quiet hours)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import JSONResponse

from api.auth import require
from api.categories import CategoryIn, CategoryOut, get_category, list_categories, put_category
from api.models import NAME
from clarion.tenants import Principal

router = APIRouter(prefix="/v1/categories", tags=["categories"])

CategoryName = Annotated[str, Path(min_length=1, max_length=64, pattern=NAME)]


@router.put(
    "/{name}",
    response_model=CategoryOut,
    responses={201: {"model": CategoryOut, "description": "the category was created"}},
)
async def put(
    name: CategoryName,
    body: CategoryIn,
    request: Request,
    principal: Annotated[Principal, Depends(require("admin"))],
) -> JSONResponse:
    category, created = await put_category(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, name=name, category=body,
        max_categories=request.app.state.settings.max_categories_per_tenant,
    )  # fmt: skip
    return JSONResponse(category.model_dump(mode="json"), status_code=201 if created else 200)


@router.get("/{name}", response_model=CategoryOut)
async def read(
    name: CategoryName, request: Request, principal: Annotated[Principal, Depends(require("admin"))]
) -> CategoryOut:
    return await get_category(engine=request.app.state.engine, tenant_id=principal.tenant_id, name=name)


@router.get("", response_model=list[CategoryOut])
async def read_all(
    request: Request, principal: Annotated[Principal, Depends(require("admin"))]
) -> list[CategoryOut]:
    return await list_categories(engine=request.app.state.engine, tenant_id=principal.tenant_id)
