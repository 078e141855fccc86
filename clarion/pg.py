"""asyncpg pools for the hot paths (accept, claim, record): plain SQL, prepared statements, no ORM overhead."""

from __future__ import annotations

import json

import asyncpg
from sqlalchemy.engine import make_url


def asyncpg_dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


async def _init(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def create_pool(database_url: str, *, size: int = 10) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(asyncpg_dsn(database_url), min_size=1, max_size=size, init=_init)
    assert pool is not None
    return pool
