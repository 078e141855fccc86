"""The Alembic migrations build exactly the schema the models describe, and go down and up again."""

from __future__ import annotations

import asyncio

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.ext.asyncio import create_async_engine

from harness.services import drop_database, fresh_database
from schema import log_models, partition_names, webhook_models  # noqa: F401 (their tables, in the metadata)
from schema.db import downgrade, upgrade
from schema.models import SQLModel


async def _diff(url: str) -> list[object]:
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(
                        sync,
                        opts={
                            "include_name": partition_names.include_name,
                            "include_object": partition_names.include_object,
                        },
                    ),
                    SQLModel.metadata,
                )
            )
    finally:
        await engine.dispose()


async def test_migrations_match_the_models_and_round_trip() -> None:
    url = await fresh_database("clarion_migrations")  # upgraded to head
    try:
        assert await _diff(url) == []
        await asyncio.to_thread(downgrade, url, "base")
        await asyncio.to_thread(upgrade, url)
        assert await _diff(url) == []
    finally:
        await drop_database(url)
