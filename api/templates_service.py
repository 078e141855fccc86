"""Templates per tenant: versioned (name, channel, locale), one active version, previews.

Guarantees:
- a template is stored only if every part compiles in the sandbox and renders with its own
  ``sample_data`` (else ``422`` naming the missing variable or the unsafe construct); the same
  holds when an older version is activated again;
- creating a version never changes an existing one; with ``activate`` it becomes the only active
  version of its (name, channel, locale), atomically (concurrent creates get distinct versions);
- a preview renders exactly what a send would (`api.template_preview`);
- the template's lock is held for a few statements touching at most the two versions that change,
  and an activation renders before it takes a connection: each request queued on the lock holds
  one of the API's pooled connections. Before, a new version rewrote every version and an
  activation rendered under the lock: 40 creates of one template at once took another tenant's
  ``PUT /v1/users`` p99 to 1.1-1.3 s, 40 activations to 0.7-0.8 s (0.2-0.3 s under 40 plain
  reads; a helper's probe, 2026-11-29), now 0.3-0.4 s and 0.1-0.5 s.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.caps import hold_under_cap, one_at_a_time
from api.errors import ApiError
from api.models import NAME
from api.template_preview import LOCALE, render_checked
from core.render import Renderer
from schema.enums import Channel
from schema.ids import uuid7
from schema.models import Template

_templates = Template.__table__  # type: ignore[attr-defined]


class TemplateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=128, pattern=NAME)
    channel: Channel
    locale: str | None = Field(
        default=None, max_length=35, pattern=LOCALE, description="default: the tenant's default locale"
    )
    subject: str | None = Field(
        default=None, max_length=998, description="email subject (required for email)"
    )
    title: str | None = Field(default=None, max_length=998, description="push title")
    body: str = Field(min_length=1, max_length=32_000, description="text body (email text part, SMS, push)")
    html: str | None = Field(default=None, max_length=60_000, description="email HTML body")
    sample_data: dict[str, Any] = Field(
        default_factory=dict, description="data the template must render with"
    )
    activate: bool = Field(default=True, description="make this version the active one")
    track_email: StrictBool | None = Field(
        default=None,
        description="email only: Clarion's own email tracking for this version (links through /t/c/, an "
        "open pixel); null follows the tenant's email_tracking setting",
    )

    @model_validator(mode="after")
    def _parts_fit_channel(self) -> TemplateIn:
        allowed = {
            Channel.email: {"subject", "html"},
            Channel.push: {"title"},
            Channel.sms: set(),
        }[self.channel]
        for part in ("subject", "title", "html"):
            if getattr(self, part) is not None and part not in allowed:
                raise ValueError(f"a {self.channel.value} template has no '{part}'")
        if self.channel is Channel.email and not self.subject:
            raise ValueError("an email template needs a 'subject'")
        if self.track_email is not None and self.channel is not Channel.email:
            raise ValueError("only an email template has 'track_email'")
        return self


class ActivateIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    channel: Channel
    locale: str = Field(max_length=35, pattern=LOCALE)
    version: int = Field(ge=1, le=2_147_483_647)


class TemplateOut(BaseModel):
    name: str
    channel: str
    locale: str
    version: int
    active: bool
    subject: str | None
    title: str | None
    body: str
    html: str | None
    track_email: bool | None
    sample_data: dict[str, Any]
    created_at: datetime


def template_out(row: Any) -> TemplateOut:
    push = row.channel == Channel.push.value
    return TemplateOut(
        name=row.name,
        channel=row.channel,
        locale=row.locale,
        version=row.version,
        active=row.active,
        subject=None if push else row.subject,
        title=row.subject if push else None,
        body=row.body,
        html=row.html,
        track_email=row.track_email,
        sample_data=row.sample_data or {},
        created_at=row.created_at,
    )


async def _lock(conn: AsyncConnection, tenant_id: str, name: str, channel: str, locale: str) -> None:
    # Serializes version numbering and activation of one (tenant, name, channel, locale).
    await one_at_a_time(conn, kind="template", key=f"{tenant_id}:{name}:{channel}:{locale.lower()}")


def _same(tenant_id: str, name: str, channel: str, locale: str) -> list[Any]:
    return [
        _templates.c.tenant_id == tenant_id,
        _templates.c.name == name,
        _templates.c.channel == channel,
        _templates.c.locale == locale,
    ]


async def create_template(
    *,
    engine: AsyncEngine,
    renderer: Renderer,
    tenant_id: str,
    default_locale: str,
    template: TemplateIn,
    max_templates: int = 500,
) -> TemplateOut:
    """Store a new version (``max + 1``) of the template; ``422`` when it does not render, ``409
    limit_reached`` when the tenant already holds ``max_templates`` versions."""
    subject = template.title if template.channel is Channel.push else template.subject
    await render_checked(
        renderer,
        subject=subject,
        body=template.body,
        html=template.html,
        data=template.sample_data,
        tenant=tenant_id,
    )
    locale = template.locale or default_locale
    channel = template.channel.value
    async with engine.begin() as conn:
        await hold_under_cap(
            conn, tenant_id=tenant_id, kind="templates", limit=max_templates,
            held=sa.select(sa.func.count()).select_from(_templates).where(_templates.c.tenant_id == tenant_id),
            message=f"A tenant may hold {max_templates} template versions.",
        )  # fmt: skip
        await _lock(conn, tenant_id, template.name, channel, locale)
        same = _same(tenant_id, template.name, channel, locale)
        latest = (await conn.execute(sa.select(sa.func.max(_templates.c.version)).where(*same))).scalar()
        if template.activate:  # the active version only: the others are already inactive
            await conn.execute(_templates.update().where(*same, _templates.c.active).values(active=False))
        row = (
            await conn.execute(
                _templates.insert()
                .values(
                    id=uuid7(),
                    tenant_id=tenant_id,
                    name=template.name,
                    channel=channel,
                    locale=locale,
                    version=(latest or 0) + 1,
                    active=template.activate,
                    subject=subject,
                    body=template.body,
                    html=template.html,
                    track_email=template.track_email,
                    sample_data=template.sample_data,
                )
                .returning(_templates)
            )
        ).one()
    return template_out(row)


async def activate_template(
    *, engine: AsyncEngine, renderer: Renderer, tenant_id: str, name: str, target: ActivateIn
) -> TemplateOut:
    """Make one stored version the active one; ``404`` when missing, ``422`` when it does not render."""
    channel = target.channel.value
    same = _same(tenant_id, name, channel, target.locale)
    version = sa.select(_templates).where(*same, _templates.c.version == target.version)
    async with engine.connect() as conn:
        row = (await conn.execute(version)).first()
    if row is None:
        raise ApiError(
            404,
            "unknown_template",
            f"No {channel} template '{name}' version {target.version} in locale '{target.locale}'.",
        )
    # Rendered before the lock and the transaction (a version's sources never change): the render
    # waits for the tenant's turn, up to TURN_WAIT_S (core/render_turns.py).
    await render_checked(
        renderer,
        subject=row.subject,
        body=row.body,
        html=row.html,
        data=row.sample_data or {},
        tenant=tenant_id,
    )
    async with engine.begin() as conn:
        await _lock(conn, tenant_id, name, channel, target.locale)
        await conn.execute(
            _templates.update()
            .where(*same, sa.or_(_templates.c.active, _templates.c.version == target.version))
            .values(active=_templates.c.version == target.version)
        )
        activated = (await conn.execute(version)).one()
    return template_out(activated)
