"""Render a template's subject, text body and HTML body with a caller's data, safely.

Guarantees of :meth:`TemplateRenderer.render` (``core.render.Renderer`` adds the scheduling):

- **Sandboxed** (``core/render_sandbox.py``). Templates run in Jinja2's
  ``ImmutableSandboxedEnvironment``: no private or dunder attributes (``''.__class__``,
  ``cycler.__init__.__globals__``, ``self._TemplateReference__context``), no mutation of lists or
  dicts, no ``include``/``extends``/``import``. Such templates fail with
  ``RenderError(code="unsafe_template")``; literal private names are refused when the template is
  compiled, computed ones when they are reached.
- **Strict** (``core/render_errors.py``). A variable missing from ``data`` fails with
  ``code="missing_variable"`` and ``variable`` naming it (``order_id``, or the dotted path
  ``user.name`` when it can be told).
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
- with a ``RequestBudget``, every render of a request (a batch) shares one CPU budget.

Not bounded here: the size of ``data`` itself (the API bounds request sizes).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Generator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import jinja2
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError

from core.headers import breaks_header
from core.render_errors import Part, RenderError, attribute_paths, missing_variable
from core.render_limits import Budget, check_deadline, check_nesting, current_budget, limit_error
from core.render_sandbox import Instrument, SandboxEnvironment
from core.render_types import RenderedContent, RequestBudget


@dataclass(frozen=True, slots=True)
class CompiledTemplate:
    """One compiled source text, shared by every render of it."""

    template: jinja2.Template
    attribute_paths: tuple[tuple[str | int, ...], ...]
    """Every literal ``a.b[0].c`` chain in the source, to name a missing attribute by its path."""


class TemplateRenderer:
    """Renders notification content synchronously, within the limits; the compiled-template cache
    is per instance."""

    def __init__(
        self, *, max_output_chars: int = 100_000, max_render_ms: int = 200, cache_size: int = 512
    ) -> None:
        self.max_output_chars = max_output_chars
        self.max_render_ms = max_render_ms
        self._environments = {
            False: SandboxEnvironment(autoescape=False),
            True: SandboxEnvironment(autoescape=True),
        }
        self._compile_cached = lru_cache(maxsize=cache_size)(self._compile)

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
                raise limit_error(f"the request's render budget ({budget.total_ms} ms) is spent")
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
        budget = self._new_budget(deadline=time.thread_time() + max_ms / 1000)
        token = current_budget.set(budget)
        try:
            return {part: self._render_part(part, tpl, data) for part, tpl in compiled}
        except RenderError as exc:
            exc.timed_out = exc.code == "render_limit" and time.thread_time() > (budget.deadline or 0.0)
            raise
        finally:
            current_budget.reset(token)

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

    def _new_budget(self, *, deadline: float | None) -> Budget:
        return Budget(
            deadline=deadline, max_render_ms=self.max_render_ms, max_value_chars=self.max_output_chars
        )

    def _compile(self, source: str, html: bool) -> CompiledTemplate:
        env = self._environments[html]
        # The optimizer folds constant expressions while compiling: keep the size checks on.
        token = current_budget.set(self._new_budget(deadline=None))
        try:
            check_nesting(source, env)
            tree = env.parse(source)
            paths = attribute_paths(tree)
            tree = Instrument().visit(tree)
            tree.set_environment(env)
            template = env.from_string(tree)
            # Jinja copies a template's globals into every render's context, and reads them as a
            # ChainMap of the template's and the environment's (set once, in SandboxEnvironment):
            # iterating it twice per part was a third of a render. One plain dict made at compile
            # time: 47.3 -> 32.7 us of CPU for a three-part email (python -m bench.render); in
            # bench.e2e (A/B/B/A), worker 0.275 -> 0.24 and API 0.40 -> 0.37 ms per notification.
            template.globals = dict(template.globals)
            return CompiledTemplate(template=template, attribute_paths=paths)
        except TemplateSyntaxError as exc:
            raise RenderError("template_syntax", f"line {exc.lineno}: {exc.message}") from None
        except (RecursionError, MemoryError, SyntaxError):
            # A long operator chain is one flat loop for the parser but a deep tree to compile; deep
            # blocks become Python code nested past its 100 indentation levels (SyntaxError).
            raise limit_error("template is too deeply nested to compile") from None
        finally:
            current_budget.reset(token)

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
                    raise limit_error(f"rendered {part} is longer than {self.max_output_chars} characters")
                check_deadline()
                chunks.append(chunk)
        except RenderError as exc:
            raise RenderError(exc.code, exc.message, variable=exc.variable, part=part) from None
        except SecurityError as exc:
            raise RenderError(
                "unsafe_template", f"template is not allowed to do this: {exc}", part=part
            ) from None
        except UndefinedError as exc:
            message = str(exc)
            variable = missing_variable(message, compiled.attribute_paths, data)
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
