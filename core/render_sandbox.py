"""The sandbox a template runs in: what it may reach, and a check on everything that can grow.

- *Reach*: Jinja2's ``ImmutableSandboxedEnvironment`` (no dunder attributes, no mutation of lists
  or dicts); literal private names (``''.__class__``, ``foo['_x']``, ``|attr('_x')``) and
  ``include``/``extends``/``import`` are refused when a template is compiled (``Instrument``),
  computed ones when they are reached.
- *Growth*: every operator, call and filter that can grow a value goes through the checks of
  ``core/render_limits.py`` before it allocates; loops, concatenations and ``{% set %}`` blocks
  are rewritten at compile time to pass through them too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import wraps
from typing import Any

from jinja2 import nodes
from jinja2.filters import make_attrgetter
from jinja2.runtime import Context, StrictUndefined
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer

from core.render_errors import RenderError
from core.render_limits import (
    CAP_FILTER,
    MAX_INT_BITS,
    STEP_FILTER,
    TEXT_FILTER,
    bounded_iter,
    capped,
    check_deadline,
    check_expanded,
    check_int_binop,
    check_join,
    check_percent_format,
    check_replace,
    check_size,
    check_str_method,
    check_sum,
    limit_error,
)


def _refuse_private(name: Any, lineno: int) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise RenderError(
            "unsafe_template", f"template may not access private attribute {name!r} (line {lineno})"
        )


class Instrument(NodeTransformer):
    """Rewrites a parsed template before it is compiled: refuses literal private names and
    ``include``/``extends``/``import``, and routes loops, ``~`` and ``{% set %}`` blocks through the
    limit checks."""

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
        node.iter = nodes.Filter(node.iter, STEP_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        # ``~`` turns each operand into text before the result can be measured: measure them first.
        node.nodes = [
            nodes.Filter(n, TEXT_FILTER, [], [], None, None, lineno=node.lineno) for n in node.nodes
        ]
        return nodes.Filter(node, CAP_FILTER, [], [], None, None, lineno=node.lineno)

    def visit_AssignBlock(self, node: nodes.AssignBlock) -> nodes.Node:
        self.generic_visit(node)
        node.filter = nodes.Filter(node.filter, CAP_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def _refuse_loader(self, node: nodes.Node) -> nodes.Node:
        raise RenderError(
            "template_syntax",
            f"include, extends and import are not supported in templates (line {node.lineno})",
        )

    visit_Include = visit_Extends = visit_Import = visit_FromImport = _refuse_loader


class _BoundedNamespace(Namespace):
    def __setitem__(self, name: str, value: Any) -> None:
        super().__setitem__(name, capped(value))


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
                check_size(len(text) + arg * repeats if func.__name__ == "do_indent" else arg)
            elif isinstance(arg, str):
                check_size(len(text) + len(arg) * repeats)
        return capped(func(*args, **kwargs))

    return checked


class SandboxEnvironment(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox, strict about undefined names, with every operator, call and filter
    that can grow a value checked first and every filter reading the clock."""

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
        self.filters[STEP_FILTER] = bounded_iter
        self.filters[CAP_FILTER] = capped
        self.filters[TEXT_FILTER] = check_expanded
        for name in ("center", "indent", "wordwrap", "batch", "slice"):
            self.filters[name] = _int_args_checked(self.filters[name])
        self.filters["format"] = self._format_filter(self.filters["format"])
        self.filters["join"] = self._join_filter(self.filters["join"])
        self.filters["replace"] = self._replace_filter(self.filters["replace"])
        for name in ("string", "tojson", "pprint", "urlencode", "xmlattr", "trim", "upper", "lower"):
            if name in self.filters:
                self.filters[name] = _expanded_first(self.filters[name])
        self.filters["sum"] = _sum_filter(self.filters["sum"])
        # Filters run in C or in Jinja's Python without passing through ``call``: each one reads
        # the clock before it starts, so a chain of 100,000-item sorts stops at the deadline.
        self.filters.update(
            {name: _clocked(f) for name, f in self.filters.items() if not name.startswith("_")}
        )
        self.finalize = check_expanded  # every {{ output }} is turned into text after this

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        check_int_binop(operator, left, right)
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int):
                    check_size(len(seq) * times)
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
                if left.bit_length() * right > MAX_INT_BITS:
                    raise limit_error("number is too large")
        elif operator == "%" and isinstance(left, str):
            check_percent_format(left)
            check_expanded(right)
        return capped(super().call_binop(context, operator, left, right))

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        check_deadline()
        check_str_method(obj, args)
        for arg in (*args, *kwargs.values()):
            check_expanded(arg)
        return capped(super().call(context, obj, *args, **kwargs))

    @staticmethod
    def _format_filter(func: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(func)
        def checked(value: Any, *args: Any, **kwargs: Any) -> Any:
            check_percent_format(str(value))
            return capped(func(value, *args, **kwargs))

        return checked

    def _join_filter(self, func: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(func)
        def checked(eval_ctx: Any, value: Iterable[Any], d: str = "", attribute: Any = None) -> Any:
            items = list(value)
            if attribute is not None:
                items = list(map(make_attrgetter(self, attribute), items))
            check_join(items, d)
            return func(eval_ctx, items, d)

        return checked

    @staticmethod
    def _replace_filter(func: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(func)
        def checked(eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> Any:
            check_replace(s, old, new)
            return func(eval_ctx, s, old, new, count)

        return checked


def _expanded_first(func: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a filter that turns its input into text: the input's expanded size is checked first."""
    skip = 2 if hasattr(func, "jinja_pass_arg") else 1

    @wraps(func)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if len(args) >= skip:
            check_expanded(args[skip - 1])
        return capped(func(*args, **kwargs))

    return checked


def _sum_filter(func: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(func)
    def checked(environment: Any, iterable: Iterable[Any], attribute: Any = None, start: Any = 0) -> Any:
        items = list(iterable)
        if attribute is not None:
            items = list(map(make_attrgetter(environment, attribute), items))
        check_size(len(items))
        check_sum(items, start)
        return capped(func(environment, items, None, start))

    return checked


def _clocked(func: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(func)
    def clocked(*args: Any, **kwargs: Any) -> Any:
        check_deadline(now=True)
        return func(*args, **kwargs)

    return clocked
