"""The API-key cache looks a key up once however many requests miss at the same moment."""

from __future__ import annotations

import asyncio

import pytest

from api.auth import KeyCache
from clarion.tenants import Principal

PRINCIPAL = Principal(tenant_id="t-1", key_id="k-1", scopes=frozenset({"send"}))


class HeldLookup:
    """A key lookup that, once started, waits for ``release()``: the requests of a test all miss
    while it is under way. Then it answers ``PRINCIPAL``, or raises ``error``."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls = 0
        self.started = asyncio.Event()
        self._released = asyncio.Event()

    async def __call__(self) -> Principal | None:
        self.calls += 1
        self.started.set()
        await self._released.wait()
        if self.error is not None:
            raise self.error
        return PRINCIPAL

    async def release(self) -> None:
        """Let the lookup answer, once it has started (every caller has missed by then: the
        callers' tasks were all scheduled before the lookup's)."""
        await self.started.wait()
        self._released.set()


async def test_concurrent_misses_share_one_lookup_and_the_answer_is_cached() -> None:
    cache, load = KeyCache(), HeldLookup()
    misses = asyncio.gather(*(cache.resolve("clk_k-1_secret", load) for _ in range(50)))
    await load.release()
    assert await misses == [PRINCIPAL] * 50
    assert load.calls == 1
    assert await cache.resolve("clk_k-1_secret", load) == PRINCIPAL
    assert load.calls == 1  # served from the cache


async def test_a_failed_lookup_reaches_every_waiter_and_is_not_cached() -> None:
    cache, broken = KeyCache(), HeldLookup(ConnectionError("database away"))
    misses = asyncio.gather(*(cache.resolve("k", broken) for _ in range(5)), return_exceptions=True)
    await broken.release()
    results = await misses
    assert broken.calls == 1 and all(isinstance(r, ConnectionError) for r in results)

    async def works() -> Principal | None:
        return PRINCIPAL

    assert await cache.resolve("k", works) == PRINCIPAL


async def test_a_cancelled_request_does_not_cancel_the_lookup_others_wait_for() -> None:
    cache, load = KeyCache(), HeldLookup()
    first = asyncio.create_task(cache.resolve("k", load))
    await load.started.wait()
    second = asyncio.create_task(cache.resolve("k", load))
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await load.release()
    assert await second == PRINCIPAL
    assert load.calls == 1  # the second request waited for the first one's lookup, not a new one
