"""A tenant with a key and the shipped templates, as tests, benchmarks and chaos runs need one."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.tenants import create_api_key, ensure_tenant
from core.templates import install_default_templates


@dataclass
class TenantInfo:
    id: str
    key: str


async def make_tenant(
    engine: AsyncEngine,
    *,
    scopes: tuple[str, ...] = ("send", "read", "admin", "preferences"),
    tenant_id: str | None = None,
) -> TenantInfo:
    tenant_id = tenant_id or f"t-{secrets.token_hex(4)}"
    async with engine.begin() as conn:
        await ensure_tenant(conn, tenant_id=tenant_id)
        await install_default_templates(conn=conn, tenant_id=tenant_id)
        key = await create_api_key(conn, tenant_id=tenant_id, scopes=scopes)
    return TenantInfo(tenant_id, key)
