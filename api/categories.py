"""A tenant's notification categories: declared once, then named by sends and by preferences.

A category says whether users are in until they opt out (``default_opted_in``), whether it can be
opted out of at all (``required``: security alerts, OTPs) and whether email waits out quiet hours.
"""

from __future__ import annotations

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.caps import hold_under_cap
from api.errors import ApiError
from schema.models import Category

_categories = Category.__table__  # type: ignore[attr-defined]


class CategoryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    default_opted_in: bool = Field(
        default=True, strict=True, description="whether users are in until they opt out"
    )
    required: bool = Field(
        default=False, strict=True, description="cannot be opted out of (security alerts, OTPs)"
    )
    email_quiet_hours: bool = Field(
        default=False, strict=True, description="hold email during quiet hours too"
    )

    @model_validator(mode="after")
    def _coherent(self) -> CategoryIn:
        if self.required and not self.default_opted_in:
            raise ValueError("a required category is always opted in (default_opted_in must be true)")
        return self


class CategoryOut(CategoryIn):
    model_config = ConfigDict(extra="ignore")
    name: str


async def put_category(
    *, engine: AsyncEngine, tenant_id: str, name: str, category: CategoryIn, max_categories: int = 1_000
) -> tuple[CategoryOut, bool]:
    """Declare or change a category; returns it and whether it was created. ``409
    limit_reached`` for a new one when the tenant already declares ``max_categories``."""
    values = category.model_dump()
    base = insert(_categories).values(tenant_id=tenant_id, name=name, **values)
    stmt = base.on_conflict_do_update(index_elements=["tenant_id", "name"], set_=values).returning(
        sa.literal_column("xmax = 0", sa.Boolean).label("inserted")
    )
    mine = _categories.c.tenant_id == tenant_id
    async with engine.begin() as conn:
        if await conn.scalar(sa.select(sa.literal(1)).where(mine, _categories.c.name == name)) is None:
            await hold_under_cap(
                conn, tenant_id=tenant_id, kind="categories", limit=max_categories,
                held=sa.select(sa.func.count()).where(mine),
                message=f"A tenant may declare {max_categories} categories.",
            )  # fmt: skip
        created = bool((await conn.execute(stmt)).scalar_one())
    return CategoryOut(name=name, **values), created


async def get_category(*, engine: AsyncEngine, tenant_id: str, name: str) -> CategoryOut:
    """The declared category; ``ApiError`` 404 when it was never declared."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                sa.select(_categories).where(_categories.c.tenant_id == tenant_id, _categories.c.name == name)
            )
        ).first()
    if row is None:
        raise ApiError(404, "unknown_category", f"No category '{name}'.")
    return CategoryOut.model_validate(row, from_attributes=True)


async def list_categories(*, engine: AsyncEngine, tenant_id: str) -> list[CategoryOut]:
    async with engine.connect() as conn:
        return await categories_of(conn, tenant_id)


async def categories_of(conn: AsyncConnection, tenant_id: str) -> list[CategoryOut]:
    rows = (
        await conn.execute(
            sa.select(_categories).where(_categories.c.tenant_id == tenant_id).order_by(_categories.c.name)
        )
    ).all()
    return [CategoryOut.model_validate(r, from_attributes=True) for r in rows]
