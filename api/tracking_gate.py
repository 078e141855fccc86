"""How much of the API's database pool anonymous email-tracking hits may hold: at most
``PER_TENANT`` hits of one tenant's mail recording at once in one API process, and at most half
the pool for all tenants' hits together, each waiting at most ``WAIT_S`` for its turn and then
``LOCK_TIMEOUT_MS`` for its engagement row.

A hit past that is still answered (the pixel, the redirect: a person's link must work) but not
recorded, and counted in ``clarion_tracking_hits_unrecorded_total``. The pixel and the links need
no API key, anyone holding one tracked mail can load them in a loop, and every hit of one token
updates one engagement row: the hits queued on its lock, each holding one of the pooled connections
the accept path shares. Before (2026-11-28, a helper's probe): 64 anonymous loops on one pixel
took another tenant's accept p99 from 18 to 866 ms (max 1.4 s, 130 accepts in 6 s instead of 514);
the same loops on a forged token, refused before the database, made it 47 ms.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

PER_TENANT = 2
WAIT_S = 0.5
LOCK_TIMEOUT_MS = 1000


class TrackingGate:
    """Per-process turns of the tracking hits that write; lives on ``app.state.tracking_gate``."""

    def __init__(self, *, pool_size: int, per_tenant: int = PER_TENANT, wait_s: float = WAIT_S) -> None:
        self.per_tenant = per_tenant
        self.wait_s = wait_s
        self._all = asyncio.Semaphore(max(1, pool_size // 2))
        self._tenants: dict[str, tuple[asyncio.Semaphore, int]] = {}  # its turns, its hits here

    @asynccontextmanager
    async def turn(self, tenant_id: str) -> AsyncIterator[bool]:
        """True while the hit holds a turn to record; False when none came within ``wait_s``."""
        turns, hits = self._tenants.get(tenant_id) or (asyncio.Semaphore(self.per_tenant), 0)
        self._tenants[tenant_id] = (turns, hits + 1)
        taken: list[asyncio.Semaphore] = []
        try:
            async with asyncio.timeout(self.wait_s):
                for semaphore in (turns, self._all):
                    await semaphore.acquire()
                    taken.append(semaphore)
        except TimeoutError:
            pass
        try:
            yield len(taken) == 2
        finally:
            for semaphore in taken:
                semaphore.release()
            turns, hits = self._tenants[tenant_id]
            if hits == 1:
                del self._tenants[tenant_id]
            else:
                self._tenants[tenant_id] = (turns, hits - 1)
