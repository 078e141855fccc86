"""asyncpg pools for the hot paths (accept, claim, record): plain SQL, prepared statements, no ORM overhead."""

from __future__ import annotations

import json

import asyncpg
from sqlalchemy.engine import make_url

from schema.db import PLAN_EACH_STATEMENT


def asyncpg_dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _init(conn: asyncpg.Connection) -> None:
    await conn.execute(PLAN_EACH_STATEMENT)
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


class _Connection(asyncpg.Connection):
    """A pooled connection released without asyncpg's reset query (``RESET ALL``, ``UNLISTEN *``...).

    That query is a full round trip on every release (and its ``RESET ALL`` would undo the
    connection's ``PLAN_EACH_STATEMENT``), and these pools change no other session state: no
    ``SET``, no ``LISTEN``, no session advisory locks, no cursors left open. An open transaction
    is still rolled back on release (asyncpg does that before the reset query).
    """

    def get_reset_query(self) -> str:
        return ""


async def create_pool(database_url: str, *, size: int = 10) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        asyncpg_dsn(database_url), min_size=1, max_size=size, init=_init, connection_class=_Connection
    )
    assert pool is not None
    return pool
