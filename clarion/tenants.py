"""Tenants and API keys: creation, hashing and lookup.

A key reads ``clk_<key id>_<secret>``; only the sha256 of the secret is stored, so a leaked
database does not leak usable keys.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from schema.enums import Scope
from schema.models import ApiKey, Tenant

_tenants = Tenant.__table__  # type: ignore[attr-defined]
_keys = ApiKey.__table__  # type: ignore[attr-defined]

ALL_SCOPES = tuple(s.value for s in Scope)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant, the key and what it may do."""

    tenant_id: str
    key_id: str
    scopes: frozenset[str]
    default_locale: str = "en"


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def split_key(key: str) -> tuple[str, str] | None:
    """``clk_<id>_<secret>`` -> (id, secret), or None when the key is not in that shape."""
    prefix, _, rest = key.partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != "clk" or not key_id or not secret or len(key) > 200:
        return None
    return key_id, secret


def new_key(key_id: str | None = None) -> tuple[str, str]:
    """A fresh (key id, full key)."""
    key_id = key_id or secrets.token_hex(6)
    return key_id, f"clk_{key_id}_{secrets.token_urlsafe(24)}"


async def ensure_tenant(conn: AsyncConnection, *, tenant_id: str, name: str | None = None) -> bool:
    """Create the tenant if missing; True when it was created."""
    result = await conn.execute(
        insert(_tenants)
        .values(id=tenant_id, name=name or tenant_id)
        .on_conflict_do_nothing()
        .returning(_tenants.c.id)
    )
    return result.first() is not None


async def create_api_key(
    conn: AsyncConnection,
    *,
    tenant_id: str,
    scopes: tuple[str, ...] = ALL_SCOPES,
    name: str = "default",
    key: str | None = None,
) -> str:
    """Store a key for the tenant and return it in full (the only time it is visible).

    With ``key`` given (``clk_<id>_<secret>``), that exact key is stored, replacing one with the same id.
    Without, a fresh key whose id no key has: a drawn id already taken is drawn again, never
    replaced (it may be another tenant's key).
    """
    unknown = set(scopes) - set(ALL_SCOPES)
    if unknown:
        raise ValueError(f"unknown scopes: {', '.join(sorted(unknown))}")
    if key is None:
        while True:
            _, drawn = new_key()
            if await _store_key(
                conn, key=drawn, tenant_id=tenant_id, scopes=scopes, name=name, replace=False
            ):
                return drawn
    await _store_key(conn, key=key, tenant_id=tenant_id, scopes=scopes, name=name, replace=True)
    return key


async def _store_key(
    conn: AsyncConnection, *, key: str, tenant_id: str, scopes: tuple[str, ...], name: str, replace: bool
) -> bool:
    """Store ``key``; whether it was stored (not, when its id is taken and ``replace`` is false)."""
    parts = split_key(key)
    if parts is None:
        raise ValueError("an API key reads clk_<id>_<secret>")
    key_id, secret = parts
    stmt = insert(_keys).values(
        id=key_id, tenant_id=tenant_id, name=name, secret_hash=hash_secret(secret), scopes=list(scopes)
    )
    if not replace:
        return (await conn.execute(stmt.on_conflict_do_nothing().returning(_keys.c.id))).first() is not None
    await conn.execute(
        stmt.on_conflict_do_update(
            index_elements=[_keys.c.id],
            set_={
                "tenant_id": tenant_id,
                "secret_hash": stmt.excluded.secret_hash,
                "scopes": list(scopes),
                "revoked_at": None,
            },
        )
    )
    return True


async def revoke_api_key(conn: AsyncConnection, *, key_id: str) -> bool:
    result = await conn.execute(
        _keys.update()
        .where(_keys.c.id == key_id, _keys.c.revoked_at.is_(None))
        .values(revoked_at=sa.func.now())
    )
    return bool(result.rowcount)


async def lookup_key(conn: AsyncConnection, key: str) -> Principal | None:
    """The principal for a full key, or None when unknown, wrong or revoked."""
    parts = split_key(key)
    if parts is None:
        return None
    key_id, secret = parts
    row = (
        await conn.execute(
            sa.select(_keys.c.secret_hash, _keys.c.tenant_id, _keys.c.scopes, _tenants.c.default_locale)
            .join(_tenants, _tenants.c.id == _keys.c.tenant_id)
            .where(_keys.c.id == key_id, _keys.c.revoked_at.is_(None))
        )
    ).first()
    if row is None or not hmac.compare_digest(row.secret_hash, hash_secret(secret)):
        return None
    return Principal(
        tenant_id=row.tenant_id,
        key_id=key_id,
        scopes=frozenset(row.scopes),
        default_locale=row.default_locale,
    )
