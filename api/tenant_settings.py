"""A tenant's delivery settings: its content-dedupe window and Clarion's email tracking.

Both apply to every notification of the tenant; workers apply a change within a few seconds.
"""

from __future__ import annotations

from typing import Annotated

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, StrictBool
from sqlalchemy.ext.asyncio import AsyncEngine

from api.json_types import JSON_NUMBER
from schema.models import Tenant

_tenants = Tenant.__table__  # type: ignore[attr-defined]

MAX_DEDUPE_WINDOW_S = 7 * 24 * 3600


class TenantSettingsIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content_dedupe_window_s: Annotated[int, Field(ge=1, le=MAX_DEDUPE_WINDOW_S), JSON_NUMBER] | None = Field(
        description="the same rendered content to the same user on the same channel within this many "
        "seconds is recorded as 'duplicate' and not sent; null turns content dedupe off",
    )
    email_tracking: StrictBool = Field(
        default=False,
        description="Clarion's own email tracking for every email of the tenant: links redirect through "
        "/t/c/ and an open pixel /t/o/ is added to the HTML; a template version's track_email overrides it",
    )


class TenantSettingsOut(BaseModel):
    content_dedupe_window_s: int | None
    email_tracking: bool


async def get_tenant_settings(*, engine: AsyncEngine, tenant_id: str) -> TenantSettingsOut:
    """The tenant's delivery settings."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                sa.select(_tenants.c.content_dedupe_window_s, _tenants.c.email_tracking).where(
                    _tenants.c.id == tenant_id
                )
            )
        ).one()
    return TenantSettingsOut(
        content_dedupe_window_s=row.content_dedupe_window_s, email_tracking=row.email_tracking
    )


async def update_tenant_settings(
    *, engine: AsyncEngine, tenant_id: str, settings: TenantSettingsIn
) -> TenantSettingsOut:
    """Replace the tenant's delivery settings; workers apply them within a few seconds."""
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                _tenants.update()
                .where(_tenants.c.id == tenant_id)
                .values(
                    content_dedupe_window_s=settings.content_dedupe_window_s,
                    email_tracking=settings.email_tracking,
                )
                .returning(_tenants.c.content_dedupe_window_s, _tenants.c.email_tracking)
            )
        ).one()
    return TenantSettingsOut(
        content_dedupe_window_s=row.content_dedupe_window_s, email_tracking=row.email_tracking
    )
