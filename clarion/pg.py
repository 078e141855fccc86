"""asyncpg pools for the hot paths (accept, claim, record): plain SQL, prepared statements, no ORM overhead."""

from __future__ import annotations

import json

import asyncpg
from sqlalchemy.engine import make_url


def asyncpg_dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


# Every statement planned for its own parameters. asyncpg prepares each statement once per
# connection, and PostgreSQL then settles on a generic plan after five runs, made from the table
# sizes of that moment: on a new or young database (a fresh deployment, a test, a benchmark) the
# notification log looked empty then, so the hot path's lookups by event id and by id kept a
# hash join over a sequential scan of the whole log for as long as the connection lived, and each
# one cost more as the log grew (1.8 ms for 14 event ids at 20,000 rows, the largest share of the
# database's time in ``bench.e2e``). Clarion's hot statements are set-based, run once per batch of
# sends, so planning each run costs a fraction of a millisecond per batch. Set once a connection is
# open, not in the startup packet: poolers such as PgBouncer refuse settings they do not know there.
PLAN_EACH_STATEMENT = "SET plan_cache_mode = force_custom_plan"


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
