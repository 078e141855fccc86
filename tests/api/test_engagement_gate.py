"""The per-process turns of engagement writes (``api/engagement_gate.py``): a tenant past its turns
waits, then gets none, while another tenant still gets one; a write cancelled while it waits or
holds a turn gives it back."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from api.engagement_gate import EngagementGate


async def test_a_tenant_past_its_turns_gets_none_and_another_tenant_still_does() -> None:
    gate = EngagementGate(pool_size=10, per_tenant=2, wait_s=0.05)
    async with AsyncExitStack() as held:
        assert [await held.enter_async_context(gate.turn("t-a")) for _ in range(2)] == [True, True]
        async with gate.turn("t-a") as third:
            assert third is False
        async with gate.turn("t-b") as theirs:
            assert theirs is True
    async with gate.turn("t-a") as again:
        assert again is True
    assert not gate._tenants


async def test_a_write_cancelled_while_it_waits_or_holds_gives_its_turn_back() -> None:
    gate = EngagementGate(pool_size=2, per_tenant=1, wait_s=5)
    holding = asyncio.Event()

    async def write() -> None:
        async with gate.turn("t-a"):
            holding.set()
            await asyncio.sleep(10)

    holder = asyncio.create_task(write())
    await holding.wait()
    waiter = asyncio.create_task(write())
    await asyncio.sleep(0.05)
    for task in (waiter, holder):
        task.cancel()
    await asyncio.gather(holder, waiter, return_exceptions=True)
    assert not gate._tenants
    async with asyncio.timeout(1), gate.turn("t-a") as mine:
        assert mine is True
