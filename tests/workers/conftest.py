"""Fixtures of the worker tests that call a worker step on the real log."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from clarion.pg import create_pool
from clarion.settings import Settings


@pytest.fixture(scope="session")
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    """An asyncpg pool on the session's database, as a worker has (its connections' JSON codecs)."""
    p = await create_pool(settings.database_url, size=2)
    yield p
    await p.close()
