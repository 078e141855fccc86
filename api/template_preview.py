"""Previews: a template rendered with the caller's data exactly as a send would render it.

The same locale fallback and version resolution as a send (`core.templates.resolve_template`), the
same sandbox and limits; a refusal is the ``422`` a send would get, naming the missing variable
or the unsafe construct. Templates are checked the same way when they are stored.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from pydantic import BaseModel, ConfigDict, Field

from api.accept_checks import render_error
from api.errors import ApiError
from core.render import RenderedContent, Renderer, RenderError
from core.templates import resolve_template
from schema.enums import Channel

LOCALE = r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$"


class PreviewIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channel: Channel
    locale: str | None = Field(default=None, max_length=35, pattern=LOCALE)
    version: int | None = Field(default=None, ge=1, le=2_147_483_647)
    data: dict[str, Any] = Field(default_factory=dict)


class PreviewOut(BaseModel):
    name: str
    channel: str
    locale: str = Field(description="the locale actually used, after fallback")
    version: int
    subject: str | None
    title: str | None
    body: str
    html: str | None


async def render_checked(
    renderer: Renderer,
    *,
    subject: str | None,
    body: str,
    html: str | None,
    data: dict[str, Any],
    tenant: str | None = None,
) -> RenderedContent:
    """Render as a send would; a refusal is a ``422`` naming the missing variable or the unsafe
    construct (a syntax error too: ``render_async`` compiles, off the event loop)."""
    try:
        return await renderer.render_async(subject=subject, body=body, html=html, data=data, tenant=tenant)
    except RenderError as exc:
        raise render_error(exc) from None


async def preview_template(
    *, pool: asyncpg.Pool, renderer: Renderer, tenant_id: str, default_locale: str, name: str, req: PreviewIn
) -> PreviewOut:
    """Render the template a send would use with ``req.data``; ``422`` names the missing variable."""
    template = await resolve_template(
        conn=pool,
        tenant_id=tenant_id,
        name=name,
        channel=req.channel.value,
        locale=req.locale or default_locale,
        version=req.version,
        default_locale=default_locale,
    )
    if template is None:
        raise ApiError(404, "unknown_template", f"No {req.channel.value} template '{name}'.")
    content = await render_checked(
        renderer,
        subject=template.subject,
        body=template.body,
        html=template.html,
        data=req.data,
        tenant=tenant_id,
    )
    push = req.channel is Channel.push
    return PreviewOut(
        name=name,
        channel=req.channel.value,
        locale=template.locale,
        version=template.version,
        subject=None if push else content.subject,
        title=content.subject if push else None,
        body=content.body,
        html=content.html,
    )
