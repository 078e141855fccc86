"""Per-process turns of one kind of database work: at most ``per_tenant`` of one tenant's at once
in one API process, at most half the pool for all tenants' together, and a bounded wait for a turn.

A turn is taken only for a tenant named by something verified (an API key, a signed token), so
the map of tenants holds real tenants only, and only while their work is in flight. What a caller
does without a turn is its own rule: ``api.engagement_gate`` (engagement writes) and
``api.preference_gate`` (a person's preference page and one-click unsubscribe) say why they bound
their work and what they answer past the bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class TenantTurns:
    """Turns of one kind of work, per tenant and for all tenants, in this process."""

    def __init__(self, *, pool_size: int, per_tenant: int, wait_s: float) -> None:
        self.per_tenant = per_tenant
        self.wait_s = wait_s
        self._all = asyncio.Semaphore(max(1, pool_size // 2))
        self._tenants: dict[str, tuple[asyncio.Semaphore, int]] = {}  # its turns, its work here

    @asynccontextmanager
    async def turn(self, tenant_id: str, *, wait_s: float | None = None) -> AsyncIterator[bool]:
        """True while the work holds a turn; False when none came within ``wait_s`` (the gate's
        own unless given)."""
        turns, hits = self._tenants.get(tenant_id) or (asyncio.Semaphore(self.per_tenant), 0)
        self._tenants[tenant_id] = (turns, hits + 1)
        taken: list[asyncio.Semaphore] = []
        try:  # released whatever ends the work, a cancellation while it waits too
            try:
                async with asyncio.timeout(self.wait_s if wait_s is None else wait_s):
                    for semaphore in (turns, self._all):
                        await semaphore.acquire()
                        taken.append(semaphore)
            except TimeoutError:
                pass
            yield len(taken) == 2
        finally:
            for semaphore in taken:
                semaphore.release()
            turns, hits = self._tenants[tenant_id]
            if hits == 1:
                del self._tenants[tenant_id]
            else:
                self._tenants[tenant_id] = (turns, hits - 1)
