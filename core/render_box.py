"""The render box: a separate process for the renders of tenants past their render CPU share.

Render threads keep a template off the event loop, but not off the GIL: while a render thread
runs, the loop waits up to ``sys.getswitchinterval()`` each time it wakes. A tenant streaming
template bombs at its CPU share (a quarter of a core) took another tenant's accept p99 from
302 ms to 677 ms that way (chaos scenario 8, single-send bombs, 2-core machine). So at accept
time, a tenant owing render CPU (``Renderer.owes``) renders here instead: in one child process,
one render at a time, with the same limits. Ordinary tenants never come here (their renders take
~0.1 ms and a round trip to the box costs more than that).

Errors: a render refused in the box raises the same ``RenderError`` as in-process; a box that
died (a render that ran it out of memory, a kill) is replaced and the render is refused with
``render_limit``.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import struct
import sys
from typing import TYPE_CHECKING, Any, Protocol

from core.render_errors import RenderError

if TYPE_CHECKING:
    from core.render_types import RenderedContent, RequestBudget


class Limits(Protocol):
    """The renderer's limits, which the box applies too."""

    max_output_chars: int
    max_render_ms: int


_Refusal = tuple[Any, str, str | None, Any]  # RenderError's code, message, variable, part
Job = tuple[tuple[int, int], tuple[str | None, str, str | None], dict[str, Any], float | None]
Answer = tuple["RenderedContent | None", "_Refusal | None", float]
LENGTH = struct.Struct("!I")
BOX_MEMORY_BYTES = 1 << 30  # every hostile template of the test corpus peaks under 64 MB


class RenderBox:
    """One child process (``python -m core.render_child``), started by ``start`` or on first use
    and replaced when it dies. One render at a time: the box is for tenants that already spent their share."""

    def __init__(self) -> None:
        self._child: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self.renders = 0  # renders asked of the box, answered or not

    async def render(
        self,
        renderer: Limits,
        *,
        subject: str | None,
        body: str,
        html: str | None,
        data: dict[str, Any],
        budget: RequestBudget | None,
    ) -> tuple[RenderedContent, float]:
        """Render in the box; returns the content and the CPU it took, which ``budget`` is charged
        with. Raises ``RenderError`` (with ``cpu_s`` set) when refused."""
        if budget is not None and budget.remaining_ms <= 0:
            raise RenderError("render_limit", f"the request's render budget ({budget.total_ms} ms) is spent")
        job: Job = (
            (renderer.max_output_chars, renderer.max_render_ms),
            (subject, body, html),
            data,
            budget.remaining_ms if budget is not None else None,
        )
        self.renders += 1
        async with self._lock:
            try:
                # Two renders' worth of CPU (one retry) plus a loaded machine's scheduling delays,
                # within the request's deadline: a render waiting longer is refused, the child
                # replaced (it may still be running the template).
                timeout = 3 + renderer.max_render_ms / 100
                if budget is not None:
                    timeout = max(0.1, min(timeout, budget.remaining_ms / 1000 + 0.5))
                answer = await asyncio.wait_for(self._ask(job), timeout)
            except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError, pickle.PickleError):
                await self._kill()
                answer = (None, ("render_limit", "template stopped its render process", None, None), 0.0)
        content, refusal, cpu_s = answer
        if budget is not None:
            budget.spend(cpu_s)
        if refusal is not None:
            code, message, variable, part = refusal
            error = RenderError(code, message, variable=variable, part=part)
            error.cpu_s = cpu_s or renderer.max_render_ms / 1000
            raise error
        assert content is not None
        return content, cpu_s

    async def start(self) -> None:
        """Start the child now if none runs. The API starts it with itself: started on first use,
        its fork and imports (~0.3 s) landed in the first second of an attack, and a third of
        tenant A's slowest 1% of accepts with it (`python -m chaos hostile --scale 0.2`)."""
        if self._child is None or self._child.returncode is not None:
            self._child = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "core.render_child",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip

    async def _ask(self, job: Job) -> Answer:
        await self.start()
        child = self._child
        assert child is not None
        assert child.stdin is not None and child.stdout is not None
        request = pickle.dumps(job)
        child.stdin.write(LENGTH.pack(len(request)) + request)
        await child.stdin.drain()
        (length,) = LENGTH.unpack(await child.stdout.readexactly(LENGTH.size))
        answer: Answer = pickle.loads(await child.stdout.readexactly(length))
        return answer

    async def _kill(self) -> None:
        child, self._child = self._child, None
        if child is not None and child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            await child.wait()

    async def aclose(self) -> None:
        """Stop the child (it also ends by itself when its stdin closes with the parent)."""
        await self._kill()
