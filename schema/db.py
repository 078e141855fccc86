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
from sqlalchemy.exc import DBAPIError
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


# How long a migration waits for each lock before it fails (``schema/migrations/env.py``); the
# default of ``CLARION_MIGRATION_LOCK_TIMEOUT_S``. 0 waits for ever.
MIGRATION_LOCK_TIMEOUT_S = 5.0


def alembic_config(database_url: str, *, lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    cfg.attributes["lock_timeout_s"] = lock_timeout_s
    return cfg


LOCK_NOT_AVAILABLE = "55P03"  # PostgreSQL's SQLSTATE for a lock not granted within lock_timeout


class MigrationLockTimeout(Exception):
    """A migration gave up waiting for a lock: the run's transaction is rolled back (index builds
    done outside it, ``schema/migrations/partition_index.py``, are kept and skipped next time).
    Run it again once the table is less busy."""


def upgrade(
    database_url: str, revision: str = "head", *, lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S
) -> None:
    """Run the Alembic migrations up to ``revision`` (blocking; call from a thread inside a loop);
    :class:`MigrationLockTimeout` when a lock was not granted within ``lock_timeout_s``."""
    try:
        command.upgrade(alembic_config(database_url, lock_timeout_s=lock_timeout_s), revision)
    except DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        raise MigrationLockTimeout(
            f"a migration waited {lock_timeout_s:g} s for a lock on a busy table and gave up, rolled "
            f"back ({exc.orig}): run it again (CLARION_MIGRATION_LOCK_TIMEOUT_S)"
        ) from exc


def downgrade(database_url: str, revision: str) -> None:
    command.downgrade(alembic_config(database_url), revision)


async def upgrade_async(database_url: str, *, lock_timeout_s: float = MIGRATION_LOCK_TIMEOUT_S) -> None:
    await asyncio.to_thread(upgrade, database_url, lock_timeout_s=lock_timeout_s)
