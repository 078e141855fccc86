"""A migration that waits for a lock on a busy table gives up after
``CLARION_MIGRATION_LOCK_TIMEOUT_S``, rolled back, instead of queueing every send behind itself
for as long as the table stays busy; run again once it is free, it completes
(``schema/migrations/env.py``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest
from sqlalchemy.exc import DBAPIError

from clarion.settings import Settings
from commands.cli import main
from commands.runner import prepare_database
from harness.services import drop_database, fresh_database
from schema.db import LOCK_NOT_AVAILABLE, MigrationLockTimeout, downgrade

LOCK_TIMEOUT_S = 0.5
# The reader lets go after this: a migration that would wait for ever ends the test, failed, not hung.
HOLD_AT_MOST_S = 30.0
DEFERRALS_COLUMN = (
    "SELECT 1 FROM information_schema.columns"
    " WHERE table_name = 'notifications' AND column_name = 'deferrals'"
)


def dsn(url: str) -> str:
    return url.replace("postgresql+asyncpg://", "postgresql://", 1)


async def migrate_while_read(url: str, migrate: Callable[[], Awaitable[None]]) -> tuple[BaseException, float]:
    """What ``migrate`` fails with while another transaction reads ``notifications`` (ACCESS
    SHARE, as a send's does), and the seconds it took to fail."""
    reader = await asyncpg.connect(dsn(url))
    try:
        async with reader.transaction():
            await reader.fetchval("SELECT count(*) FROM notifications")
            started = time.monotonic()
            migrating = asyncio.ensure_future(migrate())
            done, _ = await asyncio.wait({migrating}, timeout=HOLD_AT_MOST_S)
            took_s = time.monotonic() - started
        # Past the reader's commit: a migration that was still waiting ends now.
        assert done, f"the migration still waited for its lock after {HOLD_AT_MOST_S} s"
        error = migrating.exception()
        assert error is not None, "the migration went through the lock"
        return error, took_s
    finally:
        await reader.close()


def lock_not_granted(error: BaseException) -> bool:
    cause = error.__cause__
    return isinstance(cause, DBAPIError) and getattr(cause.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE


@pytest.fixture
async def at_0014() -> AsyncIterator[Callable[[], Awaitable[str]]]:
    """A database of its own, migrated to 0014: the next migration adds a column to notifications."""
    urls: list[str] = []

    async def make() -> str:
        urls.append(await fresh_database("clarion_migration_locks"))
        await asyncio.to_thread(downgrade, urls[-1], "0014")
        return urls[-1]

    yield make
    for url in urls:
        await drop_database(url)


async def test_a_migration_behind_an_open_transaction_fails_within_its_lock_timeout_then_runs_again(
    at_0014: Callable[[], Awaitable[str]],
) -> None:
    url = await at_0014()
    migration = Settings(env="test", database_url=url, migration_lock_timeout_s=LOCK_TIMEOUT_S)
    admin = await asyncpg.connect(dsn(url))
    try:
        error, took_s = await migrate_while_read(url, lambda: prepare_database(migration))
        assert isinstance(error, MigrationLockTimeout) and lock_not_granted(error), repr(error)
        assert LOCK_TIMEOUT_S <= took_s < 10, took_s

        # Rolled back whole: still at 0014, no column; a send's read no longer waits behind it.
        assert await admin.fetchval("SELECT version_num FROM alembic_version") == "0014"
        assert await admin.fetchval(DEFERRALS_COLUMN) is None
        await admin.execute("SET lock_timeout = 1000")
        assert await admin.fetchval("SELECT count(*) FROM notifications") == 0

        # A statement_timeout set for the application's role or database (100 ms) does not cut the
        # migration's wait short: it still fails on its lock timeout, not sooner.
        await admin.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" SET statement_timeout = 100')
        error, took_s = await migrate_while_read(url, lambda: prepare_database(migration))
        assert (lock_not_granted(error), took_s >= LOCK_TIMEOUT_S) == (True, True), (error, took_s)

        await prepare_database(migration)  # run again, the table free: it completes
        assert await admin.fetchval(DEFERRALS_COLUMN) == 1
    finally:
        await admin.close()


async def test_clarion_db_upgrade_takes_its_lock_timeout_from_the_environment_and_says_to_run_it_again(
    at_0014: Callable[[], Awaitable[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = await at_0014()
    monkeypatch.setenv("CLARION_ENV", "test")
    monkeypatch.setenv("CLARION_DATABASE_URL", url)
    monkeypatch.setenv("CLARION_MIGRATION_LOCK_TIMEOUT_S", str(LOCK_TIMEOUT_S))

    class Exited(Exception):
        """The command's SystemExit, which asyncio would not hand over as a task's exception."""

    def upgrade_command() -> None:
        try:
            main(["db", "upgrade"])
        except SystemExit as exc:
            raise Exited(exc.code) from None

    error, took_s = await migrate_while_read(url, lambda: asyncio.to_thread(upgrade_command))
    assert isinstance(error, Exited), repr(error)
    [code] = error.args
    assert str(code).startswith("clarion db upgrade: a migration waited 0.5 s for a lock"), code
    assert str(code).endswith("run it again (CLARION_MIGRATION_LOCK_TIMEOUT_S)"), code
    assert took_s < 10, took_s
