"""One tenant's render at a time: its turn at the render threads.

``RenderTurns.turn`` holds a tenant's place (an ``asyncio.Lock`` per tenant with renders waiting,
no entry outliving its last render), re-entrant within a task so a batch holds its tenant's turn
for all its items. A caller that cannot wait long asks for a bounded wait: ``TurnNotReady`` past it.
``accept_turn`` is how a request takes it: past ``TURN_WAIT_S``, a ``render_limit`` ``RenderError``
(a 422 the caller may retry), never a longer hold.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, nullcontext
from contextvars import ContextVar

from core.render_errors import TurnNotReady
from core.render_limits import limit_error
from core.render_types import RequestBudget

# How long a render waits for its tenant's turn before it is refused: a tenant's requests queue
# behind its own earlier renders, and behind four bombs in the render box (up to 5 s each at nice 19
# on a loaded machine) a request waited past a client's 10 s timeout.
TURN_WAIT_S = 3.0
_HELD_TURNS: ContextVar[frozenset[str]] = ContextVar("clarion_held_render_turns", default=frozenset())


class _Turn:
    """One tenant's place at the render threads: a lock and how many renders wait for it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0


class RenderTurns:
    """Every tenant's turn at one renderer's threads."""

    def __init__(self) -> None:
        self._turns: dict[str, _Turn] = {}

    def taken_elsewhere(self, tenant: str) -> bool:
        """Whether another task holds or waits for ``tenant``'s turn (this task's own does not count)."""
        return tenant in self._turns and tenant not in _HELD_TURNS.get()

    @asynccontextmanager
    async def turn(
        self, tenant: str, *, wait_s: float | None = None, budget: RequestBudget | None = None
    ) -> AsyncIterator[None]:
        """Hold ``tenant``'s place at the render threads (one render of a tenant at a time).
        Re-entrant within a task: a batch holds its tenant's turn for all its items, so its items
        do not queue one by one behind the tenant's other requests (20 loop bombs in a batch took
        5-10 s that way while the tenant's other requests rendered between them). With ``wait_s``,
        raises ``TurnNotReady`` when the turn did not come within that (on entry only: nothing was
        rendered). With ``budget``, the wait for the turn is render time (``RequestBudget.rendering``)."""
        held = _HELD_TURNS.get()
        if tenant in held:
            yield
            return
        turn = self._turns.setdefault(tenant, _Turn())
        turn.waiting += 1
        try:
            try:
                # asyncio.timeout, not wait_for: wait_for runs the acquire in a task of its own,
                # one per render even when the turn is free. With workers/retry.py's the same way,
                # bench.e2e A/B/B/A (2026-11-28): API 0.40-0.41 -> 0.37-0.38 ms per notification.
                with budget.rendering() if budget is not None else nullcontext():
                    async with asyncio.timeout(wait_s):
                        await turn.lock.acquire()
            except TimeoutError:
                raise TurnNotReady(tenant, wait_s or 0.0) from None
            try:
                token = _HELD_TURNS.set(held | {tenant})
                try:
                    yield
                finally:
                    _HELD_TURNS.reset(token)
            finally:
                turn.lock.release()
        finally:
            turn.waiting -= 1
            if turn.waiting == 0:
                self._turns.pop(tenant, None)  # no entry outlives its last render

    @asynccontextmanager
    async def accept_turn(self, tenant: str, *, budget: RequestBudget | None = None) -> AsyncIterator[None]:
        """``turn`` as a request takes it: waited for at most ``TURN_WAIT_S``, past which the request
        is refused with ``RenderError`` ``render_limit`` (a 422 it may retry), not held longer."""
        async with AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(self.turn(tenant, wait_s=TURN_WAIT_S, budget=budget))
            except TurnNotReady:
                raise limit_error(
                    "this tenant's earlier templates are still rendering; retry in a few seconds"
                ) from None
            yield
