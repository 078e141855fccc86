"""Text from tenants and providers, made inert before a person reads it.

A tenant's event id, user id or rule name, and a provider's answer, can hold any character. Shown
raw, an escape sequence in one is acted on by the reader's terminal (``ESC ]52;`` writes the
clipboard, ``ESC [2J`` clears the screen, C1 controls such as U+009D do the same in terminals that
honour them), a bidi override (U+202E) reorders the rest of the line, a newline forges a line of
its own. So every character that is not printable is shown as its Python escape (``\\x1b``,
``\\u202e``, ``\\n``) instead, in what the operator's terminal prints (``commands/dlq_cli.py``) and in what
an API refusal quotes (``api/refusal_text.py``).
"""

from __future__ import annotations


def inert(text: str) -> str:
    """``text`` with each non-printable character (controls, format characters such as bidi
    overrides and zero-width marks, line and paragraph separators) written as its escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
