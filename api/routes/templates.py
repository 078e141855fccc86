"""/v1/templates: versioned templates per tenant, activation and previews."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from api.auth import require
from api.errors import ApiError
from api.models import NAME
from api.template_preview import PreviewIn, PreviewOut, preview_template
from api.templates_service import (
    ActivateIn,
    TemplateIn,
    TemplateOut,
    activate_template,
    create_template,
    list_templates,
)
from clarion.tenants import Principal
from schema.enums import Channel

router = APIRouter(prefix="/v1/templates", tags=["templates"])

TemplateName = Annotated[str, Path(min_length=1, max_length=128, pattern=NAME)]


@router.post("", status_code=201, response_model=TemplateOut)
async def create(
    body: TemplateIn, request: Request, principal: Annotated[Principal, Depends(require("admin"))]
) -> TemplateOut:
    """A new version of the template (version 1 for a new one); active unless ``activate`` is false."""
    state = request.app.state
    return await create_template(
        engine=state.engine,
        renderer=state.renderer,
        tenant_id=principal.tenant_id,
        default_locale=principal.default_locale,
        template=body,
        max_templates=state.settings.max_templates_per_tenant,
    )


@router.get("", response_model=list[TemplateOut])
async def read_all(
    request: Request,
    principal: Annotated[Principal, Depends(require("read"))],
    channel: Channel | None = None,
) -> list[TemplateOut]:
    return await list_templates(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, channel=channel
    )


@router.get("/{name}", response_model=list[TemplateOut])
async def read(
    name: TemplateName,
    request: Request,
    principal: Annotated[Principal, Depends(require("read"))],
    channel: Channel | None = None,
) -> list[TemplateOut]:
    """Every version of the template, per channel and locale, newest first."""
    found = await list_templates(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, name=name, channel=channel
    )
    if not found:
        raise ApiError(404, "unknown_template", f"No template '{name}'.")
    return found


@router.post("/{name}/activate", response_model=TemplateOut)
async def activate(
    name: TemplateName,
    body: ActivateIn,
    request: Request,
    principal: Annotated[Principal, Depends(require("admin"))],
) -> TemplateOut:
    state = request.app.state
    return await activate_template(
        engine=state.engine, renderer=state.renderer, tenant_id=principal.tenant_id, name=name, target=body
    )


@router.post("/{name}/preview", response_model=PreviewOut)
async def preview(
    name: TemplateName,
    body: PreviewIn,
    request: Request,
    principal: Annotated[Principal, Depends(require("read"))],
) -> PreviewOut:
    """Render with ``data`` as a send would; ``422 missing_template_variable`` names what is missing."""
    state = request.app.state
    return await preview_template(
        pool=state.pool,
        renderer=state.renderer,
        tenant_id=principal.tenant_id,
        default_locale=principal.default_locale,
        name=name,
        req=body,
    )
