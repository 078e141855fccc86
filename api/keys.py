"""Managing a tenant's API keys: create (the secret is shown once), list (never a secret), revoke.

Keys are stored as the sha256 of their secret (``clarion.tenants``). A tenant sees and revokes only
its own keys; another tenant's key id is simply not found. A revoked key is refused by every API
process once its cached lookup expires (``api.auth.CACHE_TTL_S``, 5 s). Rotation is create-then-
revoke: both keys work in between, so callers can switch without a gap.
"""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from pydantic import BaseModel, Field, field_validator
from sqlalchemy.ext.asyncio import AsyncEngine

from api.caps import hold_under_cap
from api.errors import ApiError
from clarion.printable_ids import check_printable_id
from clarion.tenants import create_api_key, split_key
from schema.enums import Scope
from schema.models import ApiKey

_keys = ApiKey.__table__  # type: ignore[attr-defined]


class KeyIn(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(
        default="default",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9](?:[A-Za-z0-9 _.:-]*[A-Za-z0-9_.:-])?$",
        description="letters, digits, spaces and _.:- (no space at either end)",
    )
    scopes: list[Scope] = Field(min_length=1, max_length=4, description="send, read, admin, preferences")

    # The pattern says it for the document; the rule every identifier follows says it here too.
    _printable = field_validator("name")(check_printable_id)


class KeyOut(BaseModel):
    id: str
    name: str
    scopes: list[str]
    created_at: datetime
    revoked_at: datetime | None = None


class CreatedKey(KeyOut):
    key: str = Field(description="the full key; shown only in this response, store it now")


def _out(row: sa.Row) -> KeyOut:  # type: ignore[type-arg]
    return KeyOut(
        id=row.id,
        name=row.name,
        scopes=list(row.scopes),
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )


_COLUMNS = (_keys.c.id, _keys.c.name, _keys.c.scopes, _keys.c.created_at, _keys.c.revoked_at)


MAX_REVOKED_SHOWN = 100
"""Revoked keys a tenant keeps and a listing shows, the most recently revoked. The cap counts
unrevoked keys only, so a tenant creating and revoking keys in a loop grew the table and its
listing without bound; each create now deletes the older ones (revoking a deleted key is a 404)."""
_PRUNE_REVOKED = sa.text(
    """
    DELETE FROM api_keys WHERE id IN (
        SELECT id FROM api_keys WHERE tenant_id = :t AND revoked_at IS NOT NULL
         ORDER BY revoked_at DESC, id DESC OFFSET :kept)
    """
)


async def create_key(
    *, engine: AsyncEngine, tenant_id: str, name: str, scopes: list[Scope], max_keys: int = 100
) -> CreatedKey:
    """A new key for ``tenant_id`` with ``scopes``; the full key is in the result and nowhere else.
    ``409 limit_reached`` when the tenant already holds ``max_keys`` unrevoked keys."""
    unique = sorted({s.value for s in scopes})
    async with engine.begin() as conn:
        await hold_under_cap(
            conn, tenant_id=tenant_id, kind="keys", limit=max_keys,
            held=sa.select(sa.func.count()).where(_keys.c.tenant_id == tenant_id, _keys.c.revoked_at.is_(None)),
            message=f"A tenant may hold {max_keys} unrevoked keys; revoke one first.",
        )  # fmt: skip
        key = await create_api_key(conn, tenant_id=tenant_id, scopes=tuple(unique), name=name)
        await conn.execute(_PRUNE_REVOKED, {"t": tenant_id, "kept": MAX_REVOKED_SHOWN})
        parts = split_key(key)
        assert parts is not None
        row = (await conn.execute(sa.select(*_COLUMNS).where(_keys.c.id == parts[0]))).one()
    return CreatedKey(key=key, **_out(row).model_dump())


async def list_keys(*, engine: AsyncEngine, tenant_id: str) -> list[KeyOut]:
    """Every unrevoked key of the tenant and its ``MAX_REVOKED_SHOWN`` most recently revoked ones,
    oldest first; never a secret or its hash."""
    mine = _keys.c.tenant_id == tenant_id
    unrevoked = sa.select(*_COLUMNS).where(mine, _keys.c.revoked_at.is_(None))
    revoked = (
        sa.select(*_COLUMNS)
        .where(mine, _keys.c.revoked_at.is_not(None))
        .order_by(_keys.c.revoked_at.desc(), _keys.c.id.desc())
        .limit(MAX_REVOKED_SHOWN)
    )
    shown = sa.union_all(unrevoked, revoked).subquery()
    async with engine.connect() as conn:
        rows = (await conn.execute(sa.select(shown).order_by(shown.c.created_at, shown.c.id))).all()
    return [_out(r) for r in rows]


async def revoke_key(*, engine: AsyncEngine, tenant_id: str, key_id: str) -> KeyOut:
    """Revoke the tenant's key ``key_id`` (idempotent: revoking twice keeps the first time).

    Raises ``ApiError(404)`` when the tenant has no such key.
    """
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                _keys.update()
                .where(_keys.c.id == key_id, _keys.c.tenant_id == tenant_id)
                .values(revoked_at=sa.func.coalesce(_keys.c.revoked_at, sa.func.now()))
                .returning(*_COLUMNS)
            )
        ).first()
    if row is None:
        raise ApiError(404, "not_found", f"No API key {key_id}.")
    return _out(row)
