"""Tenant values and provider answers printed on an operator's terminal, made inert.

A dead letter's event id and user id are the tenant's own text (any characters the API takes), and
its error message is what a provider answered: printed raw, an escape sequence in one of them is
acted on by the operator's terminal (``ESC ]52;`` writes the clipboard, ``ESC [2J`` clears the
screen, C1 controls such as U+009D do the same in terminals that honour them) and a bidi override
(U+202E) reorders the rest of the line. Every character that is not printable is shown as its
Python escape (``\\x1b``, ``\\u202e``) instead.
"""

from __future__ import annotations

import json
from typing import Any


def inert(text: str) -> str:
    """``text`` with each non-printable character (controls, format characters such as bidi
    overrides and zero-width marks, line and paragraph separators) written as its escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def json_line(value: Any) -> str:
    """``value`` as one JSON line of ASCII only: controls, C1 and bidi characters as ``\\uXXXX``
    escapes (the value a JSON reader gets back is unchanged)."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))
