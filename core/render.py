"""Render a template's subject, text body and HTML body with a caller's data, safely.

Guarantees of :meth:`Renderer.render`:

- **Sandboxed.** Templates run in Jinja2's ``ImmutableSandboxedEnvironment``: no private or dunder
  attributes (``''.__class__``, ``cycler.__init__.__globals__``, ``self._TemplateReference__context``),
  no mutation of lists or dicts, no ``include``/``extends``/``import``. Such templates fail with
  ``RenderError(code="unsafe_template")``; literal private names are refused when the template is
  compiled, computed ones when they are reached.
- **Strict.** A variable missing from ``data`` fails with ``code="missing_variable"`` and
  ``variable`` naming it (``order_id``, or the dotted path ``user.name`` when it can be told).
- **Escaped where it matters.** Only the HTML part is autoescaped; subject and text are not.
- **Single-line subject.** A rendered subject containing CR or LF is refused (header injection).
- **Block tags swallow their line** (``trim_blocks``, ``lstrip_blocks``), which suits plain text.
- **Cached.** Compiled templates are kept in an LRU keyed by source text.

What is bounded (``code="render_limit"``), per ``render`` call:

- *time*: ``max_render_ms`` of the thread's CPU time for all parts together, checked at every loop iteration, every
  call the template makes (functions, methods, macros, recursive ``loop()``) and between output chunks;
- *size*: each rendered part is at most ``max_output_chars``, and so is every string or list the template
  builds with ``~``, ``+``, ``*``, ``%``, calls, ``{% set %}`` blocks, namespaces and the expanding
  filters (center, indent, format, join, replace, batch, slice, wordwrap). Operations that multiply their
  input (``*``, ``**``, padding widths, join, replace) are checked *before* they allocate, so one builtin
  call cannot run away while the clock is not looked at;
- ``range()`` yields at most 100,000 items (the sandbox's ``MAX_RANGE``); deep recursion is stopped.

- integers at most 16,384 bits, the *expanded* size of a structure before it becomes text, and the
  nesting of the source (brackets, blocks, unary chains) before Jinja's recursive parser sees it:
  ``core/render_limits.py`` says how each is checked;
- a render never holds an event loop: ``render_async`` runs it on the render threads, one at a
  time per tenant and, at accept time, within a quarter of a core per tenant; a ``RequestBudget`` shares one CPU
  budget between every render of a request (a batch).

Not bounded here: the size of ``data`` itself (the API bounds request sizes).
"""

from __future__ import annotations

import ast as pyast
import asyncio
import hashlib
import json
import re
import time
from collections.abc import AsyncIterator, Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any, cast

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError
from jinja2.visitor import NodeTransformer

from core.headers import breaks_header
from core.render_box import RenderBox
from core.render_errors import Part, RenderError, RenderErrorCode
from core.render_limits import (
    _CAP,
    _STEP,
    _TEXT,
    _Budget,
    _budget,
    _check_deadline,
    _Environment,
    _limit,
    check_nesting,
)
from core.render_types import RenderedContent, RequestBudget

__all__ = [
    "CompiledTemplate", "Part", "RenderError", "RenderErrorCode", "RenderedContent", "Renderer", "RequestBudget",
]  # fmt: skip


@dataclass(frozen=True, slots=True)
class CompiledTemplate:
    """One compiled source text, shared by every render of it."""

    template: jinja2.Template
    attribute_paths: tuple[tuple[str | int, ...], ...]
    """Every literal ``a.b[0].c`` chain in the source, to name a missing attribute by its path."""


# ---------------------------------------------------------------------------------------------------
# Compile-time instrumentation: refuse literal private names, make loops watch the clock, cap values.


def _refuse_private(name: Any, lineno: int) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise RenderError(
            "unsafe_template", f"template may not access private attribute {name!r} (line {lineno})"
        )


class _Instrument(NodeTransformer):
    # Children first, so ``''.__class__.__mro__`` is reported at ``__class__``.
    def visit_Getattr(self, node: nodes.Getattr) -> nodes.Node:
        self.generic_visit(node)
        _refuse_private(node.attr, node.lineno)
        return node

    def visit_Getitem(self, node: nodes.Getitem) -> nodes.Node:
        self.generic_visit(node)
        if isinstance(node.arg, nodes.Const):
            _refuse_private(node.arg.value, node.lineno)
        return node

    def visit_Filter(self, node: nodes.Filter) -> nodes.Node:
        self.generic_visit(node)
        if node.name == "attr" and node.args and isinstance(node.args[0], nodes.Const):
            _refuse_private(node.args[0].value, node.lineno)
        return node

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _STEP, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        # ``~`` turns each operand into text before the result can be measured: measure them first.
        node.nodes = [nodes.Filter(n, _TEXT, [], [], None, None, lineno=node.lineno) for n in node.nodes]
        return nodes.Filter(node, _CAP, [], [], None, None, lineno=node.lineno)

    def visit_AssignBlock(self, node: nodes.AssignBlock) -> nodes.Node:
        self.generic_visit(node)
        node.filter = nodes.Filter(node.filter, _CAP, [], [], None, None, lineno=node.lineno)
        return node

    def _refuse_loader(self, node: nodes.Node) -> nodes.Node:
        raise RenderError(
            "template_syntax",
            f"include, extends and import are not supported in templates (line {node.lineno})",
        )

    visit_Include = visit_Extends = visit_Import = visit_FromImport = _refuse_loader


def _attribute_paths(tree: nodes.Template) -> tuple[tuple[str | int, ...], ...]:
    paths: list[tuple[str | int, ...]] = []
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        parts: list[str | int] = []
        current: nodes.Node = node
        while True:
            if isinstance(current, nodes.Getattr):
                parts.append(current.attr)
                current = current.node
            elif (
                isinstance(current, nodes.Getitem)
                and isinstance(current.arg, nodes.Const)
                and isinstance(current.arg.value, str | int)
            ):
                parts.append(current.arg.value)
                current = current.node
            else:
                break
        if isinstance(current, nodes.Name):
            paths.append((current.name, *reversed(parts)))
    return tuple(paths)


# ---------------------------------------------------------------------------------------------------
# Naming the missing variable.

_UNDEFINED_NAME = re.compile(r"^(['\"])(?P<name>.+)\1 is undefined$")
_NO_ATTRIBUTE = re.compile(r" has no attribute (['\"])(?P<name>.+)\1$")
_NO_ELEMENT = re.compile(r" has no element (?P<name>.+)$")
_MISSING = object()


def _lookup(data: Any, key: str | int) -> Any:
    try:
        return data[key]
    except (TypeError, LookupError):
        return getattr(data, key, _MISSING) if isinstance(key, str) else _MISSING


def _dotted(path: tuple[str | int, ...]) -> str:
    text = str(path[0])
    for key in path[1:]:
        text += f"[{key}]" if isinstance(key, int) else f".{key}"
    return text


def _missing_variable(message: str, compiled: CompiledTemplate, data: dict[str, Any]) -> str | None:
    if match := _UNDEFINED_NAME.match(message):
        return match["name"]
    key: str | int
    if match := _NO_ATTRIBUTE.search(message):
        key = match["name"]
    elif match := _NO_ELEMENT.search(message):
        try:
            key = pyast.literal_eval(match["name"])
        except (ValueError, SyntaxError):
            key = match["name"]
    else:
        return None
    candidates = [path for path in compiled.attribute_paths if path[-1] == key]
    for path in candidates:
        parent: Any = data
        for step in path[:-1]:
            parent = _lookup(parent, step)
            if parent is _MISSING:
                break
        if parent is not _MISSING and _lookup(parent, key) is _MISSING:
            return _dotted(path)
    return _dotted(candidates[0]) if candidates else str(key)


# ---------------------------------------------------------------------------------------------------


# Renders never hold the event loop. Each tenant has at most one render on these threads at a
# time (``render_async``): one tenant streaming 200 ms template bombs took A's accept p99 from
# 234 ms to 4.6 s (chaos scenario 8) while A's cheap renders queued behind them on a shared pool.
RENDER_THREADS = 4
_RENDER_THREADS = ThreadPoolExecutor(max_workers=RENDER_THREADS, thread_name_prefix="clarion-render")


_HELD_TURNS: ContextVar[frozenset[str]] = ContextVar("clarion_held_render_turns", default=frozenset())


class _Turn:
    """One tenant's place at the render threads: a lock and how many renders wait for it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0


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
# How long a render waits for its tenant's turn before it is refused: a tenant's requests queue
# behind its own earlier renders, and behind four bombs in the render box (up to 5 s each at nice 19
# on a loaded machine) a request waited past a client's 10 s timeout.
TURN_WAIT_S = 3.0


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
        raise _limit("this tenant's templates used their share of render time; retry in a few seconds")
    if budget is not None and budget.remaining_ms <= 0:
        raise _limit(f"the request's render budget ({budget.total_ms} ms) is spent")


class Renderer:
    """Renders notification content; one instance is meant to be shared by a whole worker."""

    def __init__(
        self, *, max_output_chars: int = 100_000, max_render_ms: int = 200, cache_size: int = 512
    ) -> None:
        self.max_output_chars = max_output_chars
        self.max_render_ms = max_render_ms
        self._environments = {False: _Environment(autoescape=False), True: _Environment(autoescape=True)}
        self._compile_cached = lru_cache(maxsize=cache_size)(self._compile)
        self._turns: dict[str, _Turn] = {}
        self._debts: dict[str, _CpuDebt] = {}
        self._box = RenderBox()

    def compile(self, source: str, *, html: bool = False) -> CompiledTemplate:
        """Compile ``source`` (autoescaped when ``html``), or return the cached compilation of it.

        Raises ``RenderError`` with ``template_syntax`` or ``unsafe_template``.
        """
        return self._compile_cached(source, html)

    def check_syntax(self, *, subject: str | None, body: str, html: str | None) -> None:
        """Raise ``RenderError`` (``template_syntax``, or ``unsafe_template`` for literal private
        attribute access) if any part would not compile; used when a template is saved."""
        for part, source, is_html in self._parts(subject, body, html):
            self._compile_part(part, source, is_html)

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
        call = partial(self._timed_render, subject=subject, body=body, html=html, data=data, budget=budget)
        if len(self._debts) > 10_000:  # settled-up entries go; a debtor's entry stays
            for name in [n for n, d in self._debts.items() if d.settle() == 0.0]:
                del self._debts[name]
        debt = self._debts.setdefault(tenant or "", _CpuDebt())
        _may_render(debt if cpu_share else None, budget)
        async with self.turn(tenant or "", wait_s=TURN_WAIT_S if cpu_share else None):
            # Checked again with the turn: a render that waited for it must not run once the
            # request's budget or the tenant's share was spent meanwhile.
            _may_render(debt if cpu_share else None, budget)
            try:
                if cpu_share and debt.settle() > OWING_S:
                    content, spent_s = await self._box.render(
                        self, subject=subject, body=body, html=html, data=data, budget=budget
                    )
                elif cpu_share:
                    content, spent_s = await self._sliced(call, debt, subject, body, html, data, budget)
                else:
                    content, spent_s = await asyncio.get_running_loop().run_in_executor(_RENDER_THREADS, call)
            except RenderError as exc:
                debt.debt_s += exc.cpu_s
                raise
            debt.debt_s += spent_s
            return content

    async def _sliced(
        self,
        call: partial[tuple[RenderedContent, float]],
        debt: _CpuDebt,
        subject: str | None,
        body: str,
        html: str | None,
        data: dict[str, Any],
        budget: RequestBudget | None,
    ) -> tuple[RenderedContent, float]:
        """``THREAD_SLICE_MS`` on a render thread, the rest of the limit in the render box."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(_RENDER_THREADS, partial(call, max_ms=THREAD_SLICE_MS))
        except RenderError as exc:
            if not exc.timed_out or exc.cpu_s * 1000 >= self.max_render_ms:
                raise
            debt.debt_s += exc.cpu_s
        return await self._box.render(self, subject=subject, body=body, html=html, data=data, budget=budget)

    @asynccontextmanager
    async def turn(self, tenant: str, *, wait_s: float | None = None) -> AsyncIterator[None]:
        """Hold ``tenant``'s place at the render threads (one render of a tenant at a time).
        Re-entrant within a task: a batch holds its tenant's turn for all its items, so its items
        do not queue one by one behind the tenant's other requests (20 loop bombs in a batch took
        5-10 s that way while the tenant's other requests rendered between them). With ``wait_s``,
        raises ``RenderError`` (``render_limit``) when the turn did not come within that."""
        held = _HELD_TURNS.get()
        if tenant in held:
            yield
            return
        turn = self._turns.setdefault(tenant, _Turn())
        turn.waiting += 1
        try:
            try:
                await asyncio.wait_for(turn.lock.acquire(), wait_s)
            except TimeoutError:
                raise _limit(
                    "this tenant's earlier templates are still rendering; retry in a few seconds"
                ) from None
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

    def render(
        self,
        *,
        subject: str | None,
        body: str,
        html: str | None,
        data: dict[str, Any],
        budget: RequestBudget | None = None,
        max_ms: float | None = None,
    ) -> RenderedContent:
        """Render every given part with ``data``, within the limits described in the module docstring.
        With ``budget``, the render also spends (and is limited by) the CPU time left in it; with
        ``max_ms``, it is refused (``render_limit``, ``timed_out``) past that much CPU at once."""
        started = time.thread_time()
        try:
            return self._render_once(
                subject=subject, body=body, html=html, data=data, budget=budget, max_ms=max_ms
            )
        finally:
            if budget is not None:
                budget.spend(time.thread_time() - started)

    def _render_once(
        self, *, subject: str | None, body: str, html: str | None, data: dict[str, Any],
        budget: RequestBudget | None, max_ms: float | None = None,
    ) -> RenderedContent:  # fmt: skip
        sliced = max_ms is not None
        max_ms = min(float(self.max_render_ms), max_ms or float(self.max_render_ms))
        if budget is not None:
            max_ms = min(max_ms, budget.remaining_ms)
            if max_ms <= 0:
                raise _limit(f"the request's render budget ({budget.total_ms} ms) is spent")
        compiled = [
            (part, self._compile_part(part, source, is_html))
            for part, source, is_html in self._parts(subject, body, html)
        ]
        try:
            out = self._render_parts(compiled, data, max_ms)
        except RenderError as exc:
            if not exc.timed_out or budget is not None or sliced:
                raise
            # The CPU clock also counts what the template did not cause (a full garbage collection
            # took ~170 ms of CPU in a worker before gc.freeze, see workers/app.py): one more try
            # tells an unlucky render from a slow template.
            out = self._render_parts(compiled, data, max_ms)
        rendered_subject = out.get("subject")
        if rendered_subject is not None and breaks_header(rendered_subject):
            # Also as RFC 2047-decoded: an encoded word in the data can carry CR/LF into a header.
            raise RenderError("unsafe_template", "subject must be a single line", part="subject")
        return RenderedContent(subject=rendered_subject, body=out["body"], html=out.get("html"))

    def _render_parts(
        self, compiled: list[tuple[Part, CompiledTemplate]], data: dict[str, Any], max_ms: float
    ) -> dict[Part, str]:
        budget = self._budget(deadline=time.thread_time() + max_ms / 1000)
        token = _budget.set(budget)
        try:
            return {part: self._render_part(part, tpl, data) for part, tpl in compiled}
        except RenderError as exc:
            exc.timed_out = exc.code == "render_limit" and time.thread_time() > (budget.deadline or 0.0)
            raise
        finally:
            _budget.reset(token)

    def content_hash(self, content: RenderedContent, *, recipient: str, channel: str) -> str:
        """SHA-256 hex of what the recipient would see on this channel (content-window dedupe)."""
        canonical = json.dumps(
            [channel, recipient, content.subject, content.body, content.html],
            ensure_ascii=False,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()

    # -- internals ------------------------------------------------------------------------------

    @staticmethod
    def _parts(subject: str | None, body: str, html: str | None) -> list[tuple[Part, str, bool]]:
        parts: list[tuple[Part, str, bool]] = []
        if subject is not None:
            parts.append(("subject", subject, False))
        parts.append(("body", body, False))
        if html is not None:
            parts.append(("html", html, True))
        return parts

    def _budget(self, *, deadline: float | None) -> _Budget:
        return _Budget(
            deadline=deadline, max_render_ms=self.max_render_ms, max_value_chars=self.max_output_chars
        )

    def _compile(self, source: str, html: bool) -> CompiledTemplate:
        env = self._environments[html]
        # The optimizer folds constant expressions while compiling: keep the size checks on.
        token = _budget.set(self._budget(deadline=None))
        try:
            check_nesting(source, env)
            tree = env.parse(source)
            paths = _attribute_paths(tree)
            tree = _Instrument().visit(tree)
            tree.set_environment(env)
            return CompiledTemplate(template=env.from_string(tree), attribute_paths=paths)
        except TemplateSyntaxError as exc:
            raise RenderError("template_syntax", f"line {exc.lineno}: {exc.message}") from None
        except (RecursionError, MemoryError, SyntaxError):
            # A long operator chain is one flat loop for the parser but a deep tree to compile; deep
            # blocks become Python code nested past its 100 indentation levels (SyntaxError).
            raise _limit("template is too deeply nested to compile") from None
        finally:
            _budget.reset(token)

    def _compile_part(self, part: Part, source: str, html: bool) -> CompiledTemplate:
        try:
            return self.compile(source, html=html)
        except RenderError as exc:
            raise RenderError(exc.code, exc.message, part=part) from None

    def _render_part(self, part: Part, compiled: CompiledTemplate, data: dict[str, Any]) -> str:
        chunks: list[str] = []
        size = 0
        stream = cast(Generator[str, None, None], compiled.template.generate(data))
        try:
            for chunk in stream:
                size += len(chunk)
                if size > self.max_output_chars:
                    raise _limit(f"rendered {part} is longer than {self.max_output_chars} characters")
                _check_deadline()
                chunks.append(chunk)
        except RenderError as exc:
            raise RenderError(exc.code, exc.message, variable=exc.variable, part=part) from None
        except SecurityError as exc:
            raise RenderError(
                "unsafe_template", f"template is not allowed to do this: {exc}", part=part
            ) from None
        except UndefinedError as exc:
            message = str(exc)
            variable = _missing_variable(message, compiled, data)
            text = f"template variable {variable!r} is undefined" if variable else message
            raise RenderError("missing_variable", text, variable=variable, part=part) from None
        except OverflowError as exc:
            text = "range() is limited to 100000 items" if "MAX_RANGE" in str(exc) else str(exc)
            raise RenderError("render_limit", text, part=part) from None
        except (RecursionError, MemoryError) as exc:
            raise RenderError(
                "render_limit", f"template is too deep or too large: {exc}", part=part
            ) from None
        except Exception as exc:
            raise RenderError("template_error", f"{type(exc).__name__}: {exc}", part=part) from None
        finally:
            stream.close()
        text = "".join(chunks)
        if not text.isascii():
            try:
                text.encode()
            except UnicodeEncodeError as exc:  # a lone surrogate: no provider can carry it
                raise RenderError(
                    "template_error",
                    f"rendered {part} holds text that is not valid Unicode ({exc.reason})",
                    part=part,
                ) from None
        return text
