"""``Renderer``: renders shared fairly, so a tenant's templates never hold the event loop or another tenant.

What one render guarantees and bounds (sandbox, limits, the missing variable's name) is
``core/render_template.py``'s; this module decides *where* and *when* a render runs:

- never on the event loop for long: ``render_async`` runs a render on the render threads, unless
  its sources rendered in under ``CHEAP_MS`` last time (then within ``INLINE_MS`` on the loop, at
  once with ``render_now`` when nothing stands in its way);
- one render of a tenant at a time on those threads (``turns``, ``core/render_turns.py``), so one
  tenant holds at most one; a caller that cannot wait long for it asks for a bounded wait and gets
  ``TurnNotReady`` past it (``accept_turn`` refuses the request then; the worker defers the send,
  ``workers/content.py``);
- at accept time, within ``RENDER_CPU_SHARE`` of a core per tenant: past its burst a tenant is
  refused, and a tenant owing render CPU renders in the render box (``core/render_box.py``);
- a ``RequestBudget`` shares one CPU budget between every render of a request (a batch).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial
from typing import Any

from core.render_box import RenderBox
from core.render_errors import Part, RenderError, RenderErrorCode, TurnNotReady
from core.render_limits import limit_error
from core.render_template import CompiledTemplate, TemplateRenderer
from core.render_turns import RenderTurns
from core.render_types import RenderedContent, RequestBudget

__all__ = [
    "CompiledTemplate", "Part", "RenderError", "RenderErrorCode", "RenderedContent", "Renderer", "RequestBudget",
    "TurnNotReady",
]  # fmt: skip


# Renders never hold the event loop. Each tenant has at most one render on these threads at a
# time (``render_async``): one tenant streaming 200 ms template bombs took A's accept p99 from
# 234 ms to 4.6 s (chaos scenario 8) while A's cheap renders queued behind them on a shared pool.
RENDER_THREADS = 4
_RENDER_THREADS = ThreadPoolExecutor(max_workers=RENDER_THREADS, thread_name_prefix="clarion-render")


# At accept time a tenant's renders may spend RENDER_CPU_SHARE of one core, with bursts up to
# RENDER_CPU_BURST_S of CPU: ordinary templates take ~0.1 ms (a tenant sending 2,000/s, about one
# API process's most, spends ~0.2 s/s), so only a tenant streaming templates that run into the
# limits meets it. Without it, one tenant's bombs (each up to 2 x max_render_ms of
# CPU) took another tenant's accept p99 from 322 ms to 1.1 s on this 2-core machine.
RENDER_CPU_SHARE = 0.25  # measured: 0.5 let B's bombs take A's p99 to 4.8x alone, 0.25 to 2.3x
RENDER_CPU_BURST_S = 1.0
# A tenant owing more than this is kept out of shared accept transactions (``AcceptQueue``):
# ordinary renders (~0.1 ms) never come near it, a template running into the limits passes it.
OWING_S = 0.05
# At accept time a render gets this much CPU on the API's own threads; one that needs more is
# refused there and finished in the render box. A render thread running Python holds the GIL the
# event loop needs after each of its system calls (it waits up to sys.getswitchinterval(), 5 ms,
# per call), so every request in flight slowed while a bomb ran its 200 ms in a thread:
# `python -m chaos hostile --scale 0.2`, tenant A's accept p99 25-32 ms alone, 132-180 ms under
# B's bombs with whole renders in threads. Ordinary templates take ~0.1 ms and never meet it.
THREAD_SLICE_MS = 10
# Sources whose last render took under CHEAP_MS of CPU render on the event loop, within INLINE_MS
# (past it they go to the threads as any other): handing an ordinary ~0.1 ms render to a thread and
# back cost more than the render (ThreadPoolExecutor.submit and the wake-ups were ~15% of a
# worker's samples in py-spy under `bench.e2e`, 2026-11-25). INLINE_MS bounds what one render can
# hold the loop for, whatever its data.
CHEAP_MS = 1.0
INLINE_MS = 2.0


class _CpuDebt:
    """Render CPU a tenant has spent and not yet paid back (it pays RENDER_CPU_SHARE per second)."""

    def __init__(self) -> None:
        self.debt_s = 0.0
        self.at = time.monotonic()

    def settle(self) -> float:
        now = time.monotonic()
        self.debt_s = max(0.0, self.debt_s - (now - self.at) * RENDER_CPU_SHARE)
        self.at = now
        return self.debt_s


def _may_render(debt: _CpuDebt | None, budget: RequestBudget | None) -> None:
    """Raise ``render_limit`` when the tenant's share (``debt``, at accept time) or the request's
    ``budget`` is spent: such a render is refused without waiting for a render thread."""
    if debt is not None and debt.settle() > RENDER_CPU_BURST_S:
        raise limit_error("this tenant's templates used their share of render time; retry in a few seconds")
    if budget is not None and budget.remaining_ms <= 0:
        raise limit_error(f"the request's render budget ({budget.total_ms} ms) is spent")


class Renderer(TemplateRenderer):
    """Renders notification content; one instance is meant to be shared by a whole worker."""

    def __init__(
        self, *, max_output_chars: int = 100_000, max_render_ms: int = 200, cache_size: int = 512
    ) -> None:
        super().__init__(
            max_output_chars=max_output_chars, max_render_ms=max_render_ms, cache_size=cache_size
        )
        self.turns = RenderTurns()  # one render of a tenant at a time (core/render_turns.py)
        self._debts: dict[str, _CpuDebt] = {}
        self._cheap: dict[tuple[str | None, str, str | None], bool] = {}  # sources -> last render was cheap
        self._box = RenderBox()

    async def render_async(
        self,
        *,
        subject: str | None,
        body: str,
        html: str | None,
        data: dict[str, Any],
        budget: RequestBudget | None = None,
        tenant: str | None = None,
        cpu_share: bool = True,
    ) -> RenderedContent:
        """``render`` on the renderer's own threads, so the event loop keeps answering while a
        template runs (the GIL is handed back every ``sys.getswitchinterval()``, 5 ms). Renders of
        one ``tenant`` take turns, so one tenant holds at most one render thread. With
        ``cpu_share`` (at accept time), a tenant past its share of render CPU is refused at once;
        the worker renders what was accepted without it (a refusal there would fail a send)."""
        now = self.render_now(
            subject=subject,
            body=body,
            html=html,
            data=data,
            budget=budget,
            tenant=tenant,
            cpu_share=cpu_share,
        )
        if now is not None:
            return now
        call = partial(self._timed_render, subject=subject, body=body, html=html, data=data, budget=budget)
        in_box = partial(
            self._box.render, self, subject=subject, body=body, html=html, data=data, budget=budget
        )
        debt = self._debt(tenant)
        _may_render(debt if cpu_share else None, budget)
        turn = self.turns.accept_turn if cpu_share else self.turns.turn
        async with turn(tenant or "", budget=budget):
            # Checked again with the turn: a render that waited for it must not run once the
            # request's budget or the tenant's share was spent meanwhile.
            _may_render(debt if cpu_share else None, budget)
            key = (subject, body, html)
            try:
                with budget.rendering() if budget is not None else nullcontext():
                    if cpu_share and debt.settle() > OWING_S:
                        content, spent_s = await in_box()
                    elif (inline := self._inline(call, key, debt)) is not None:
                        content, spent_s = inline
                    elif cpu_share:
                        content, spent_s = await self._sliced(call, in_box, debt)
                    else:
                        content, spent_s = await asyncio.get_running_loop().run_in_executor(
                            _RENDER_THREADS, call
                        )
            except RenderError as exc:
                debt.debt_s += exc.cpu_s
                raise
            self._spent(key, debt, spent_s)
            return content

    def render_now(
        self,
        *,
        subject: str | None,
        body: str,
        html: str | None,
        data: dict[str, Any],
        budget: RequestBudget | None = None,
        tenant: str | None = None,
        cpu_share: bool = True,
    ) -> RenderedContent | None:
        """``render_async``'s render on the event loop, done at once when nothing stands in its way:
        the sources rendered cheaply last time, no other task holds or waits for ``tenant``'s turn,
        the tenant owes no render CPU (``cpu_share``) and the ``budget`` is not spent. None when any
        of these fails or the render ran past ``INLINE_MS`` (then ``render_async`` decides where it
        runs); raises the ``RenderError`` of any other refusal."""
        # The turn is not taken: a render on the loop cannot interleave with another of the tenant's.
        # Taking it (an asyncio.Lock in two context managers, a timeout) cost about as much as the
        # render itself: py-spy under bench.e2e (2026-11-29), the worker's Content.render 25% of its
        # CPU of which the template's own render 13.6%.
        key = (subject, body, html)
        if not self._cheap.get(key) or self.turns.taken_elsewhere(tenant or ""):
            return None
        debt = self._debt(tenant)
        if (cpu_share and debt.settle() > OWING_S) or (budget is not None and budget.remaining_ms <= 0):
            return None
        call = partial(self._timed_render, subject=subject, body=body, html=html, data=data, budget=budget)
        try:
            with budget.rendering() if budget is not None else nullcontext():
                inline = self._inline(call, key, debt)
        except RenderError as exc:
            debt.debt_s += exc.cpu_s
            raise
        if inline is None:
            return None
        self._spent(key, debt, inline[1])
        return inline[0]

    def _debt(self, tenant: str | None) -> _CpuDebt:
        if len(self._debts) > 10_000:  # settled-up entries go; a debtor's entry stays
            for name in [n for n, d in self._debts.items() if d.settle() == 0.0]:
                del self._debts[name]
        return self._debts.setdefault(tenant or "", _CpuDebt())

    def _spent(self, key: tuple[str | None, str, str | None], debt: _CpuDebt, spent_s: float) -> None:
        """A render of ``key``'s sources took ``spent_s`` of CPU: charged, and whether it was cheap."""
        if len(self._cheap) > 4_096:
            self._cheap.clear()
        self._cheap[key] = spent_s * 1000 < CHEAP_MS
        debt.debt_s += spent_s

    def _inline(
        self,
        call: partial[tuple[RenderedContent, float]],
        key: tuple[str | None, str, str | None],
        debt: _CpuDebt,
    ) -> tuple[RenderedContent, float] | None:
        """Render on the event loop, within ``INLINE_MS``, sources whose last render took under
        ``CHEAP_MS``; None when they are not known to be cheap or ran out of it (then they go to the
        threads). Raises the ``RenderError`` of any other refusal."""
        if not self._cheap.get(key):
            return None
        try:
            return call(max_ms=INLINE_MS)
        except RenderError as exc:
            if not exc.timed_out:
                raise
            debt.debt_s += exc.cpu_s
            self._cheap[key] = False
            return None

    async def _sliced(
        self,
        call: partial[tuple[RenderedContent, float]],
        in_box: Callable[[], Awaitable[tuple[RenderedContent, float]]],
        debt: _CpuDebt,
    ) -> tuple[RenderedContent, float]:
        """``THREAD_SLICE_MS`` on a render thread, the rest of the limit in the render box."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(_RENDER_THREADS, partial(call, max_ms=THREAD_SLICE_MS))
        except RenderError as exc:
            if not exc.timed_out or exc.cpu_s * 1000 >= self.max_render_ms:
                raise
            debt.debt_s += exc.cpu_s
        return await in_box()

    async def start_box(self) -> None:
        """Start the render box's process ahead of its first use (the API does, at start-up)."""
        await self._box.start()

    async def aclose(self) -> None:
        """Stop the render box's process, if one was started."""
        await self._box.aclose()

    def owes(self, tenant: str) -> bool:
        """Whether ``tenant``'s recent renders ran past its CPU share by more than ``OWING_S``."""
        debt = self._debts.get(tenant)
        return debt is not None and debt.settle() > OWING_S

    def _timed_render(self, **kwargs: Any) -> tuple[RenderedContent, float]:
        """``render`` and the thread CPU it took; a refused render still costs what it spent."""
        started = time.thread_time()
        try:
            content = self.render(**kwargs)
        except RenderError as exc:
            exc.cpu_s = time.thread_time() - started
            raise
        return content, time.thread_time() - started
