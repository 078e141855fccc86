"""The limits every render keeps, by construction: checked on each operation and filter that can
grow a value, before it allocates, so one builtin call (a C loop that never looks at the clock)
cannot run away. The sandbox (``core/render_sandbox.py``) puts these checks in a template's way.

- *time*: a CPU-time deadline per render, read at every loop iteration, call and output chunk;
- *size*: strings and sequences at most ``max_value_chars``; the *expanded* size of a structure
  (``[a, a]`` repeated doubles what ``string`` or ``tojson`` would print while holding two
  references) is walked with the same budget before it is turned into text;
- *numbers*: integers at most ``MAX_INT_BITS`` bits, checked before ``*``, ``**`` and ``+`` run
  (``a*a`` on a 8,000-bit number squares its size; eighteen such lines took 11 s and 836 MB);
- *depth*: template sources nest at most ``MAX_NESTING`` brackets and blocks (Jinja's parser and
  code generator recurse per level: 100 nested parentheses raised ``RecursionError``).
"""

from __future__ import annotations

import re
import string
import time
from collections.abc import Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from jinja2.lexer import TOKEN_BLOCK_BEGIN, TOKEN_NAME, TOKEN_OPERATOR
from jinja2.sandbox import ImmutableSandboxedEnvironment

from core.render_errors import RenderError

# The budget of the render in progress. Checks read it from a ContextVar because the compiled
# template calls back into the environment, which is shared by every render of this Renderer.


@dataclass(slots=True)
class Budget:
    deadline: float | None
    max_render_ms: int
    max_value_chars: int
    checks: int = 0  # deadline checks so far; the clock is read on every CLOCK_EVERY-th


# Reading the thread's CPU clock costs 0.7 us here (timeit of time.thread_time, 2026-11-25), about
# what a short render step costs itself, so it is read every CLOCK_EVERY steps; between two
# readings at most CLOCK_EVERY - 1 steps run, each bounded by the size checks.
CLOCK_EVERY = 8


current_budget: ContextVar[Budget | None] = ContextVar("clarion_render_budget", default=None)
_DEFAULT_MAX_VALUE_CHARS = 100_000
MAX_INT_BITS = 16_384
MAX_NESTING = 40
STEP_FILTER = "_clarion_step"
CAP_FILTER = "_clarion_cap"
TEXT_FILTER = "_clarion_text"
_BLOCKS = frozenset({"if", "for", "macro", "call", "filter", "with", "block", "autoescape"})


def limit_error(message: str) -> RenderError:
    """The ``render_limit`` error with ``message``."""
    return RenderError("render_limit", message)


def check_deadline(*, now: bool = False) -> None:
    """Refuse the render in progress once past its CPU deadline (read every ``CLOCK_EVERY``-th
    call, or at once with ``now``)."""
    budget = current_budget.get()
    if budget is None or budget.deadline is None:
        return
    budget.checks += 1
    # CPU time of this thread, not wall time: a render preempted on a busy machine is not slow.
    if (now or budget.checks % CLOCK_EVERY == 0) and time.thread_time() > budget.deadline:
        raise limit_error(f"template took longer than {budget.max_render_ms} ms to render")


def _max_chars() -> int:
    budget = current_budget.get()
    return budget.max_value_chars if budget is not None else _DEFAULT_MAX_VALUE_CHARS


def check_size(size: int) -> None:
    """Refuse a value of ``size`` characters or items above the render's limit."""
    if size > (limit := _max_chars()):
        raise limit_error(f"template builds a value longer than {limit} characters")


def capped(value: Any) -> Any:
    """``value``, once its length is checked against the size limit."""
    if isinstance(value, str | list | tuple | bytes):
        check_size(len(value))
    return value


def check_expanded(value: Any) -> Any:
    """Refuse ``value`` when turning it into text would exceed the size limit, counting a structure
    referenced twice twice (as ``str``, ``tojson`` and ``pprint`` print it). The walk stops as soon
    as the limit is passed, so it costs at most the limit's worth of steps."""
    if isinstance(value, str | int | float | bool) or value is None:
        _check_number(value)
        return value
    limit = _max_chars()
    seen = 0
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str | bytes):
            seen += len(item) + 2
        elif isinstance(item, int) and not isinstance(item, bool):
            seen += item.bit_length() // 3 + 1
        elif isinstance(item, Mapping):
            seen += 2 * len(item) + 2
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            seen += len(item) + 2
            stack.extend(item)
        else:
            seen += 8
        if seen > limit:
            raise limit_error(f"template builds a value longer than {limit} characters")
    return value


def _check_number(value: Any) -> None:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise limit_error("number is too large")


def check_int_binop(operator: str, left: Any, right: Any) -> None:
    """Integers: the result's bit length, estimated before Python computes it."""
    if not (isinstance(left, int) and isinstance(right, int)):
        return
    if operator == "*":
        bits = left.bit_length() + right.bit_length()
    elif operator == "**":
        bits = left.bit_length() * right if right > 0 and abs(left) > 1 else 0
    else:
        bits = max(left.bit_length(), right.bit_length()) + 1
    if bits > MAX_INT_BITS:
        raise limit_error("number is too large")


def check_sum(items: list[Any], start: Any) -> None:
    """``sum`` of sequences concatenates them: bound the total before it runs (quadratic in C)."""
    if isinstance(start, str | list | tuple):
        check_size(len(start) + sum(len(i) for i in items if isinstance(i, str | list | tuple)))
    else:
        for item in items:
            _check_number(item)


def check_nesting(source: str, environment: ImmutableSandboxedEnvironment) -> None:
    """Refuse sources that nest brackets or blocks deeper than ``MAX_NESTING`` (or chain unary
    operators that far), before Jinja's recursive parser and code generator see them."""
    depth = 0
    block_depth = 0
    unary_run = 0
    expect_tag = False
    try:
        for _, kind, value in environment.lex(source):  # operators come as ("operator", "(")
            if kind == "whitespace":
                continue
            if kind == TOKEN_OPERATOR and value in "([{":
                depth += 1
            elif kind == TOKEN_OPERATOR and value in ")]}":
                depth = max(0, depth - 1)
            elif kind == TOKEN_BLOCK_BEGIN:
                expect_tag = True
                continue
            elif kind == TOKEN_NAME and expect_tag:
                if value in _BLOCKS:
                    block_depth += 1
                elif value.startswith("end"):
                    block_depth = max(0, block_depth - 1)
            unary = (kind == TOKEN_OPERATOR and value in "+-") or (kind == TOKEN_NAME and value == "not")
            unary_run = unary_run + 1 if unary else 0
            expect_tag = False
            if max(depth, block_depth, unary_run) > MAX_NESTING:
                raise limit_error(f"template nests deeper than {MAX_NESTING} levels")
    except RenderError:
        raise
    except Exception:  # a lexing error is reported by the parser, with its line
        return


def bounded_iter(value: Iterable[Any]) -> Iterator[Any]:
    """``value``'s items, the deadline checked before each (every template loop goes through it)."""
    for item in value:
        check_deadline()
        yield item


_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def check_percent_format(fmt: str) -> None:
    """Refuse ``%`` widths above the size limit, and ``*`` widths."""
    for match in _PERCENT_SPEC.finditer(fmt):
        for width in match.groups():
            if width == "*":
                raise limit_error("'*' widths are not allowed in format strings")
            if width is not None:
                check_size(int(width))


def _check_brace_format(fmt: str) -> None:
    for _, _, spec, _ in string.Formatter().parse(fmt):
        if not spec:
            continue
        if "{" in spec:
            raise limit_error("nested format specifications are not allowed")
        for width in _DIGITS.findall(spec):
            check_size(int(width))


def check_replace(text: Any, old: Any, new: Any) -> None:
    """Refuse a replace whose result would be above the size limit, before it runs."""
    text, old, new = str(text), str(old), str(new)
    count = text.count(old)
    check_size(len(text) + count * max(0, len(new) - len(old)))


def check_join(items: list[Any], separator: Any) -> None:
    """Refuse a join whose result would be above the size limit, before it runs."""
    for item in items:
        check_expanded(item)
    check_size(sum(len(str(item)) for item in items) + len(str(separator)) * max(0, len(items) - 1))


def check_str_method(obj: Any, args: tuple[Any, ...]) -> None:
    """Pre-check the ``str`` methods whose output can be far larger than their input."""
    method = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner = getattr(method, "__self__", None)
    if not isinstance(owner, str):
        return
    name = getattr(method, "__name__", "")
    if name in {"center", "ljust", "rjust", "zfill"} and args and isinstance(args[0], int):
        check_size(args[0])
    elif name == "expandtabs":
        tabsize = args[0] if args and isinstance(args[0], int) else 8
        check_size(len(owner) + owner.count("\t") * tabsize)
    elif name == "replace" and len(args) >= 2:
        check_replace(owner, args[0], args[1])
    elif name == "join" and args:
        check_join(list(args[0]), owner)
    elif name in {"format", "format_map"}:
        _check_brace_format(owner)
