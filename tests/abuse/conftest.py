"""Fixtures of the abuse suite: ``clarion api`` as its own OS process, and the response contract."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.ports import free_port
from clarion.settings import Settings
from harness.services import ClarionProcess, wait_until
from tests.conftest import make_tenant


@pytest.fixture
async def running_api(settings: Settings, engine: AsyncEngine) -> AsyncIterator[tuple[str, str]]:
    """``clarion api`` as a separate process on a free port, and an admin key for a fresh tenant."""
    own = settings.model_copy(update={"api_port": free_port()})
    # Caps stay out of the fuzzers' way: a rule create turning from 201 into 409 halfway through a
    # run changes what the stateful fuzzer can draw next (hypothesis calls that flaky generation).
    caps = {
        "CLARION_MAX_RULES_PER_TENANT": "100000",
        "CLARION_MAX_TEMPLATES_PER_TENANT": "1000000",
        "CLARION_MAX_CATEGORIES_PER_TENANT": "100000",
        "CLARION_MAX_API_KEYS_PER_TENANT": "10000",
    }
    proc = ClarionProcess(own, "api", extra_env=caps)
    proc.start()
    url = f"http://127.0.0.1:{own.api_port}"
    tenant = await make_tenant(engine)
    try:

        async def up() -> bool:
            try:
                async with httpx.AsyncClient() as c:
                    return (await c.get(f"{url}/healthz")).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until(up, 60, 0.2)
        yield url, tenant.key
    finally:
        await asyncio.to_thread(proc.stop, 15)
