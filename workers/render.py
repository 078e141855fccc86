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

Not bounded here: the size of ``data`` itself (the API bounds request sizes).
"""

from __future__ import annotations

import ast as pyast
import hashlib
import json
import re
import string
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache, wraps
from typing import Any, Literal, cast

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError
from jinja2.filters import make_attrgetter
from jinja2.runtime import Context, StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

RenderErrorCode = Literal[
    "missing_variable", "unsafe_template", "template_syntax", "template_error", "render_limit"
]
Part = Literal["subject", "body", "html"]


class RenderError(Exception):
    """A template could not be rendered; ``code`` says why, ``part`` says where.

    ``message`` is for people (``template variable 'order_id' is undefined``); ``str(error)``
    prefixes it with the part. ``variable`` is set when ``code == "missing_variable"``.

    ``template_error`` covers runtime faults in the template itself (``{{ 1 / 0 }}``,
    ``{{ 'a' + 1 }}``); the other codes are described in the module docstring.
    """

    def __init__(
        self, code: RenderErrorCode, message: str, *, variable: str | None = None, part: Part | None = None
    ) -> None:
        super().__init__(f"{part}: {message}" if part else message)
        self.code: RenderErrorCode = code
        self.message = message
        self.variable = variable
        self.part = part
        self.timed_out = False  # the render ran out of its CPU-time budget (not a size limit)

    def __repr__(self) -> str:
        return f"RenderError(code={self.code!r}, message={self.message!r}, variable={self.variable!r})"


@dataclass(frozen=True, slots=True)
class RenderedContent:
    subject: str | None
    """Email subject or push title."""
    body: str
    """Text body."""
    html: str | None
    """Email HTML body."""


@dataclass(frozen=True, slots=True)
class CompiledTemplate:
    """One compiled source text, shared by every render of it."""

    template: jinja2.Template
    attribute_paths: tuple[tuple[str | int, ...], ...]
    """Every literal ``a.b[0].c`` chain in the source, to name a missing attribute by its path."""


# ---------------------------------------------------------------------------------------------------
# The budget of the render in progress. Checks read it from a ContextVar because the compiled
# template calls back into the environment, which is shared by every render of this Renderer.


@dataclass(slots=True)
class _Budget:
    deadline: float | None
    max_render_ms: int
    max_value_chars: int
    checks: int = 0  # deadline checks so far; the clock is read on every CLOCK_EVERY-th


# Reading the thread's CPU clock is a system call (~3 us here, more than a short render's chunk);
# between two readings at most CLOCK_EVERY - 1 steps run, each bounded by the size checks.
CLOCK_EVERY = 8


_budget: ContextVar[_Budget | None] = ContextVar("clarion_render_budget", default=None)
_DEFAULT_MAX_VALUE_CHARS = 100_000
_MAX_POWER_BITS = 16_384
_STEP = "_clarion_step"
_CAP = "_clarion_cap"


def _limit(message: str) -> RenderError:
    return RenderError("render_limit", message)


def _check_deadline() -> None:
    budget = _budget.get()
    if budget is None or budget.deadline is None:
        return
    budget.checks += 1
    # CPU time of this thread, not wall time: a render preempted on a busy machine is not slow.
    if budget.checks % CLOCK_EVERY == 0 and time.thread_time() > budget.deadline:
        raise _limit(f"template took longer than {budget.max_render_ms} ms to render")


def _max_chars() -> int:
    budget = _budget.get()
    return budget.max_value_chars if budget is not None else _DEFAULT_MAX_VALUE_CHARS


def _check_size(size: int) -> None:
    if size > (limit := _max_chars()):
        raise _limit(f"template builds a value longer than {limit} characters")


def _capped(value: Any) -> Any:
    if isinstance(value, str | list | tuple | bytes):
        _check_size(len(value))
    return value


def _bounded_iter(value: Iterable[Any]) -> Iterator[Any]:
    for item in value:
        _check_deadline()
        yield item


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def _check_percent_format(fmt: str) -> None:
    for match in _PERCENT_SPEC.finditer(fmt):
        for width in match.groups():
            if width == "*":
                raise _limit("'*' widths are not allowed in format strings")
            if width is not None:
                _check_size(int(width))


def _check_brace_format(fmt: str) -> None:
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if not spec:
            continue
        if "{" in spec:
            raise _limit("nested format specifications are not allowed")
        for width in _DIGITS.findall(spec):
            _check_size(int(width))


def _check_replace(text: Any, old: Any, new: Any) -> None:
    text, old, new = str(text), str(old), str(new)
    count = text.count(old)
    _check_size(len(text) + count * max(0, len(new) - len(old)))


def _check_join(items: list[Any], separator: Any) -> None:
    _check_size(sum(len(str(item)) for item in items) + len(str(separator)) * max(0, len(items) - 1))


def _check_str_method(obj: Any, args: tuple[Any, ...]) -> None:
    """Pre-check the ``str`` methods whose output can be far larger than their input."""
    method = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner = getattr(method, "__self__", None)
    if not isinstance(owner, str):
        return
    name = getattr(method, "__name__", "")
    if name in {"center", "ljust", "rjust", "zfill"} and args and isinstance(args[0], int):
        _check_size(args[0])
    elif name == "expandtabs":
        tabsize = args[0] if args and isinstance(args[0], int) else 8
        _check_size(len(owner) + owner.count("\t") * tabsize)
    elif name == "replace" and len(args) >= 2:
        _check_replace(owner, args[0], args[1])
    elif name == "join" and args:
        _check_join(list(args[0]), owner)
    elif name in {"format", "format_map"}:
        _check_brace_format(owner)


class _BoundedNamespace(Namespace):
    def __setitem__(self, name: str, value: Any) -> None:
        super().__setitem__(name, _capped(value))


def _int_args_checked(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a filter whose parameters are widths, counts or inserted strings (``indent``'s prefix,
    ``wordwrap``'s wrapstring): refuse ones that could take the output above the size limit."""
    skip = 2 if hasattr(func, "jinja_pass_arg") else 1

    @wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        value = args[skip - 1] if len(args) >= skip else ""
        text = value if isinstance(value, str) else ""
        # indent inserts its prefix once per line; wordwrap its wrapstring at most every other char
        repeats = text.count("\n") + 1 if func.__name__ == "do_indent" else len(text) // 2 + 1
        for arg in (*args[skip:], *kwargs.values()):
            if isinstance(arg, int) and not isinstance(arg, bool):
                _check_size(arg)
            elif isinstance(arg, str):
                _check_size(len(text) + len(arg) * repeats)
        return _capped(func(*args, **kwargs))

    return checked


class _Environment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, *, autoescape: bool) -> None:
        super().__init__(
            autoescape=autoescape,
            undefined=StrictUndefined,
            auto_reload=False,
            trim_blocks=True,  # a block tag on a line of its own leaves no blank line behind
            lstrip_blocks=True,
        )
        self.globals.pop("lipsum", None)  # CPU-heavy and useless in notifications
        self.globals["namespace"] = _BoundedNamespace
        self.filters[_STEP] = _bounded_iter
        self.filters[_CAP] = _capped
        for name in ("center", "indent", "wordwrap", "batch", "slice"):
            self.filters[name] = _int_args_checked(self.filters[name])
        self.filters["format"] = self._format_filter(self.filters["format"])
        self.filters["join"] = self._join_filter(self.filters["join"])
        self.filters["replace"] = self._replace_filter(self.filters["replace"])

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int):
                    _check_size(len(seq) * times)
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                if left.bit_length() * right > _MAX_POWER_BITS:
                    raise _limit("number is too large")
        elif operator == "%" and isinstance(left, str):
            _check_percent_format(left)
        return _capped(super().call_binop(context, operator, left, right))

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        _check_deadline()
        _check_str_method(obj, args)
        return _capped(super().call(context, obj, *args, **kwargs))

    @staticmethod
    def _format_filter(func: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(func)
        def checked(value: Any, *args: Any, **kwargs: Any) -> Any:
            _check_percent_format(str(value))
            return _capped(func(value, *args, **kwargs))

        return checked

    def _join_filter(self, func: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(func)
        def checked(eval_ctx: Any, value: Iterable[Any], d: str = "", attribute: Any = None) -> Any:
            items = list(value)
            if attribute is not None:
                items = list(map(make_attrgetter(self, attribute), items))
            _check_join(items, d)
            return func(eval_ctx, items, d)

        return checked

    @staticmethod
    def _replace_filter(func: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(func)
        def checked(eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> Any:
            _check_replace(s, old, new)
            return func(eval_ctx, s, old, new, count)

        return checked


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


class Renderer:
    """Renders notification content; one instance is meant to be shared by a whole worker."""

    def __init__(
        self, *, max_output_chars: int = 100_000, max_render_ms: int = 200, cache_size: int = 512
    ) -> None:
        self.max_output_chars = max_output_chars
        self.max_render_ms = max_render_ms
        self._environments = {False: _Environment(autoescape=False), True: _Environment(autoescape=True)}
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
        self, *, subject: str | None, body: str, html: str | None, data: dict[str, Any]
    ) -> RenderedContent:
        """Render every given part with ``data``, within the limits described in the module docstring."""
        compiled = [
            (part, self._compile_part(part, source, is_html))
            for part, source, is_html in self._parts(subject, body, html)
        ]
        try:
            out = self._render_parts(compiled, data)
        except RenderError as exc:
            if not exc.timed_out:
                raise
            # The CPU clock also counts what the template did not cause (a garbage collection, the
            # machine pausing this thread): one more try tells an unlucky render from a slow template.
            out = self._render_parts(compiled, data)
        rendered_subject = out.get("subject")
        if rendered_subject is not None and ("\r" in rendered_subject or "\n" in rendered_subject):
            raise RenderError("unsafe_template", "subject must be a single line", part="subject")
        return RenderedContent(subject=rendered_subject, body=out["body"], html=out.get("html"))

    def _render_parts(
        self, compiled: list[tuple[Part, CompiledTemplate]], data: dict[str, Any]
    ) -> dict[Part, str]:
        budget = self._budget(deadline=time.thread_time() + self.max_render_ms / 1000)
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
        return hashlib.sha256(canonical.encode()).hexdigest()

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
            tree = env.parse(source)
            paths = _attribute_paths(tree)
            tree = _Instrument().visit(tree)
            tree.set_environment(env)
            return CompiledTemplate(template=env.from_string(tree), attribute_paths=paths)
        except TemplateSyntaxError as exc:
            raise RenderError("template_syntax", f"line {exc.lineno}: {exc.message}") from None
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
        return "".join(chunks)
