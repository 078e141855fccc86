"""How many of a kind one tenant may hold: rules, template versions, webhook endpoints, categories,
API keys.

Every process loads every tenant's rules, every preference page lists every category, and so on,
so each kind has a cap (``CLARION_MAX_*_PER_TENANT``). :func:`hold_under_cap` is the check every
create runs in its own transaction: it takes the tenant's lock for the kind first, so two creates
racing each other cannot both pass the count, then refuses with ``409 limit_reached`` (the limit in
``details``) when the tenant already holds ``limit``. :func:`one_at_a_time` is that lock, also
taken alone where changes to one thing must not interleave (a template's versions, a global rule,
an endpoint's replays, a user's preferences).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from api.errors import ApiError


async def one_at_a_time(conn: AsyncConnection, *, kind: str, key: str) -> None:
    """Wait until no other transaction holds ``kind`` for ``key``, then hold it until ``conn``'s
    transaction ends: the next one's statements see what this one wrote (read committed)."""
    await conn.execute(
        sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:kind || ':' || :key, 0))"),
        {"kind": kind, "key": key},
    )


async def took_alone(conn: AsyncConnection, *, kind: str, key: str) -> bool:
    """``one_at_a_time`` without the wait: hold ``kind`` for ``key`` until ``conn``'s transaction
    ends and return True, or return False at once when another transaction holds it."""
    took = await conn.execute(
        sa.text("SELECT pg_try_advisory_xact_lock(hashtextextended(:kind || ':' || :key, 0))"),
        {"kind": kind, "key": key},
    )
    return bool(took.scalar_one())


async def hold_under_cap(
    conn: AsyncConnection, *, tenant_id: str, kind: str, held: sa.Select[Any], limit: int, message: str
) -> None:
    """Lock ``kind`` for ``tenant_id`` until ``conn``'s transaction ends; then ``ApiError`` 409
    ``limit_reached`` with ``message`` when ``held`` (a ``SELECT count(*)``) is ``limit`` or more."""
    await one_at_a_time(conn, kind=kind, key=tenant_id)
    if (await conn.execute(held)).scalar_one() >= limit:
        raise ApiError(409, "limit_reached", message, {"limit": limit})
