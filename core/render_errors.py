"""What a render raises, the codes that say why, and the name of the variable it missed.

    Exception
     +-- RenderError    the content does not render: ``code`` says why (a 422 at accept, a
     |                  ``failed`` send at the worker)
     +-- TurnNotReady   the tenant's turn at the render threads did not come in time: nothing
                        was rendered and nothing is wrong with the content (accept answers
                        ``render_limit``, retry later; the worker defers the send to a later batch)

``TurnNotReady`` is not a ``RenderError`` on purpose: every ``except RenderError`` fails the send
or refuses the request for its content, and a send that only has to wait must not be failed.

A template reading a variable ``data`` lacks fails with ``missing_variable`` and that variable's
name: ``order_id``, or the dotted path ``user.name`` / ``items[0].sku`` when the source spells the
chain out literally (``attribute_paths``) and ``data`` tells which link of it is missing.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Literal

from jinja2 import nodes

RenderErrorCode = Literal[
    "missing_variable",
    "unsafe_template",
    "template_syntax",
    "template_error",
    "render_limit",
    "empty_subject",
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
        self.cpu_s = 0.0  # thread CPU the render spent before it was refused

    def __repr__(self) -> str:
        return f"RenderError(code={self.code!r}, message={self.message!r}, variable={self.variable!r})"


class TurnNotReady(Exception):
    """``tenant``'s turn at the render threads did not come within the wait asked for
    (``Renderer.turn(wait_s=...)``): its earlier renders still hold it. Nothing was rendered."""

    def __init__(self, tenant: str, wait_s: float) -> None:
        super().__init__(f"tenant {tenant!r}'s earlier renders held its turn for more than {wait_s} s")
        self.tenant = tenant
        self.wait_s = wait_s


def attribute_paths(tree: nodes.Template) -> tuple[tuple[str | int, ...], ...]:
    """Every literal ``a.b[0].c`` chain in a parsed template, to name a missing link by its path."""
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


def missing_variable(
    message: str, paths: tuple[tuple[str | int, ...], ...], data: dict[str, Any]
) -> str | None:
    """The variable Jinja's ``UndefinedError`` ``message`` is about: the first of ``paths`` that ends
    in the missing key and whose parent ``data`` does hold; None when the message names none."""
    if match := _UNDEFINED_NAME.match(message):
        return match["name"]
    key: str | int
    if match := _NO_ATTRIBUTE.search(message):
        key = match["name"]
    elif match := _NO_ELEMENT.search(message):
        try:
            key = ast.literal_eval(match["name"])
        except (ValueError, SyntaxError):
            key = match["name"]
    else:
        return None
    candidates = [path for path in paths if path[-1] == key]
    for path in candidates:
        parent: Any = data
        for step in path[:-1]:
            parent = _lookup(parent, step)
            if parent is _MISSING:
                break
        if parent is not _MISSING and _lookup(parent, key) is _MISSING:
            return _dotted(path)
    return _dotted(candidates[0]) if candidates else str(key)
