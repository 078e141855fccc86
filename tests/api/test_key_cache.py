"""The API-key cache looks a key up once however many requests miss at the same moment."""

from __future__ import annotations

import asyncio

import pytest

from api.auth import KeyCache
from clarion.tenants import Principal

PRINCIPAL = Principal(tenant_id="t-1", key_id="k-1", scopes=frozenset({"send"}))


async def test_concurrent_misses_share_one_lookup_and_the_answer_is_cached() -> None:
    cache = KeyCache()
    lookups = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def load() -> Principal | None:
        nonlocal lookups
        lookups += 1
        started.set()
        await release.wait()
        return PRINCIPAL

    misses = asyncio.gather(*(cache.resolve("clk_k-1_secret", load) for _ in range(50)))
    await started.wait()  # the lookup runs once every caller has missed: it held them all back
    release.set()
    assert await misses == [PRINCIPAL] * 50
    assert lookups == 1
    assert await cache.resolve("clk_k-1_secret", load) == PRINCIPAL
    assert lookups == 1  # served from the cache


async def test_a_failed_lookup_reaches_every_waiter_and_is_not_cached() -> None:
    cache = KeyCache()
    calls = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def broken() -> Principal | None:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        raise ConnectionError("database away")

    misses = asyncio.gather(*(cache.resolve("k", broken) for _ in range(5)), return_exceptions=True)
    await started.wait()
    release.set()
    results = await misses
    assert calls == 1 and all(isinstance(r, ConnectionError) for r in results)

    async def works() -> Principal | None:
        return PRINCIPAL

    assert await cache.resolve("k", works) == PRINCIPAL


async def test_a_cancelled_request_does_not_cancel_the_lookup_others_wait_for() -> None:
    cache = KeyCache()
    started, release = asyncio.Event(), asyncio.Event()
    lookups = 0

    async def load() -> Principal | None:
        nonlocal lookups
        lookups += 1
        started.set()
        await release.wait()
        return PRINCIPAL

    first = asyncio.create_task(cache.resolve("k", load))
    await started.wait()
    second = asyncio.create_task(cache.resolve("k", load))
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    release.set()
    assert await second == PRINCIPAL
    assert lookups == 1  # the second request waited for the first one's lookup, not a new one
