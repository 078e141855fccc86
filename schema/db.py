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

from clarion.pg import PLAN_EACH_STATEMENT

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


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
