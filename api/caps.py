"""How many of a kind one tenant may hold: rules, template versions, webhook endpoints, categories,
API keys.

Every process loads every tenant's rules, every preference page lists every category, and so on,
so each kind has a cap (``CLARION_MAX_*_PER_TENANT``). :func:`hold_under_cap` is the check every
create runs in its own transaction: it takes the tenant's lock for the kind first, so two creates
racing each other cannot both pass the count, then refuses with ``409 limit_reached`` (the limit in
``details``) when the tenant already holds ``limit``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from api.errors import ApiError


async def hold_under_cap(
    conn: AsyncConnection, *, tenant_id: str, kind: str, held: sa.Select[Any], limit: int, message: str
) -> None:
    """Lock ``kind`` for ``tenant_id`` until ``conn``'s transaction ends; then ``ApiError`` 409
    ``limit_reached`` with ``message`` when ``held`` (a ``SELECT count(*)``) is ``limit`` or more."""
    await conn.execute(
        sa.text("SELECT pg_advisory_xact_lock(hashtext(:kind || ':' || :t))"), {"kind": kind, "t": tenant_id}
    )
    if (await conn.execute(held)).scalar_one() >= limit:
        raise ApiError(409, "limit_reached", message, {"limit": limit})
