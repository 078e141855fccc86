"""Engine factory, database creation and migrations."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import asyncpg
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine
from sqlmodel.ext.asyncio.session import AsyncSession

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


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


def create_engine(database_url: str, *, pool_size: int = 10) -> AsyncEngine:
    engine = create_async_engine(
        database_url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
    )

    @event.listens_for(engine.sync_engine, "connect")
    def plan_each_statement(dbapi_connection: Any, _: Any) -> None:  # why: clarion.pg
        cursor = dbapi_connection.cursor()
        cursor.execute(PLAN_EACH_STATEMENT)
        cursor.close()

    return engine


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, class_=AsyncSession, expire_on_commit=False)


def _asyncpg_dsn(database_url: str, database: str | None = None) -> str:
    url = make_url(database_url).set(drivername="postgresql")
    if database is not None:
        url = url.set(database=database)
    return url.render_as_string(hide_password=False)


async def ensure_database(database_url: str) -> bool:
    """Create the database named in the URL if it is missing. Returns True when it was created."""
    name = make_url(database_url).database
    conn = await asyncpg.connect(_asyncpg_dsn(database_url, "postgres"))
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if exists:
            return False
        await conn.execute(f'CREATE DATABASE "{name}"')
        return True
    finally:
        await conn.close()


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Run the Alembic migrations up to ``revision`` (blocking; call from a thread inside a loop)."""
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


async def upgrade_async(database_url: str) -> None:
    await asyncio.to_thread(upgrade, database_url)
