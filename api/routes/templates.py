"""/v1/templates: versioned templates per tenant, activation and previews."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from api.auth import require
from api.errors import ApiError
from api.models import NAME
from api.template_list import MAX_PAGE, list_templates, next_link
from api.template_preview import PreviewIn, PreviewOut, preview_template
from api.templates_service import ActivateIn, TemplateIn, TemplateOut, activate_template, create_template
from clarion.tenants import Principal
from schema.enums import Channel

router = APIRouter(prefix="/v1/templates", tags=["templates"])

TemplateName = Annotated[str, Path(min_length=1, max_length=128, pattern=NAME)]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE, description="versions per page")]
Cursor = Annotated[
    str | None, Query(max_length=1024, description="the next page, from the Link header of the last")
]


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
    response: Response,
    principal: Annotated[Principal, Depends(require("read"))],
    channel: Channel | None = None,
    cursor: Cursor = None,
    limit: Limit = MAX_PAGE,
) -> list[TemplateOut]:
    """The tenant's template versions a page at a time (``api/template_list.py``): by name,
    channel and locale, newest version first; a ``Link: <...>; rel="next"`` header names the next."""
    found, after = await list_templates(
        engine=request.app.state.engine,
        tenant_id=principal.tenant_id,
        channel=channel,
        cursor=cursor,
        limit=limit,
    )
    response.headers.update(next_link(request.url.path, cursor=after, limit=limit, channel=channel))
    return found


@router.get("/{name}", response_model=list[TemplateOut])
async def read(
    name: TemplateName,
    request: Request,
    response: Response,
    principal: Annotated[Principal, Depends(require("read"))],
    channel: Channel | None = None,
    cursor: Cursor = None,
    limit: Limit = MAX_PAGE,
) -> list[TemplateOut]:
    """Every version of the template, per channel and locale, newest first, a page at a time."""
    found, after = await list_templates(
        engine=request.app.state.engine, tenant_id=principal.tenant_id, name=name, channel=channel,
        cursor=cursor, limit=limit,
    )  # fmt: skip
    if not found and cursor is None:
        raise ApiError(404, "unknown_template", f"No template '{name}'.")
    response.headers.update(next_link(request.url.path, cursor=after, limit=limit, channel=channel))
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
