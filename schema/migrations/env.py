"""Alembic environment: runs migrations over the async engine.

The migration's connection waits at most ``lock_timeout_s`` (``config.attributes``, from
``CLARION_MIGRATION_LOCK_TIMEOUT_S`` through ``schema.db.upgrade``) for each lock: an ``ALTER
TABLE`` queued behind a long transaction on the log would otherwise hold every send queued behind
itself for as long as it waits. It fails instead, rolled back, and is run again (README, "Kubernetes").
Its statements have no ``statement_timeout``: a role's or database's, set for the application, must
not cut an index build short.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.ext.asyncio import create_async_engine

from schema import log_models, models, partition_names, webhook_models  # noqa: F401 (each registers its tables)
from schema.db import MIGRATION_LOCK_TIMEOUT_S

target_metadata = models.SQLModel.metadata


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        include_name=partition_names.include_name,
        include_object=partition_names.include_object,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_async_engine(context.config.get_main_option("sqlalchemy.url") or "")
    lock_timeout_s = float(context.config.attributes.get("lock_timeout_s", MIGRATION_LOCK_TIMEOUT_S))
    async with engine.connect() as conn:
        # Session settings (not SET LOCAL): they hold through autocommit blocks too.
        await conn.exec_driver_sql(f"SET lock_timeout = {round(lock_timeout_s * 1000)}")
        await conn.exec_driver_sql("SET statement_timeout = 0")
        await conn.commit()  # Alembic then begins and commits the migrations' own transaction
        await conn.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    context.configure(url=context.config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata)
    with context.begin_transaction():
        context.run_migrations()
else:
    asyncio.run(_run_async())
