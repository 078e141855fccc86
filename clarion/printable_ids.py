"""What an identifier a tenant chooses may hold: printable characters, no whitespace at either end.

Event ids, user ids (a recipient's external id) and API key names travel: into logs, CSV exports,
the operator's terminal (``clarion dlq list``), ``/ops`` and the tenants' own dashboards. Clarion
quotes them escaped where it shows them (``clarion/inert.py``), but what reads them downstream may
not: an escape sequence is acted on by a terminal, a bidi override reorders a line, a zero-width
character makes two ids look alike. Until 2026-11-29 the API took any characters in event and user
ids. A new identifier is now refused (422 ``validation_error``) when it holds

- a control character (Unicode category Cc: C0, DEL, and C1 such as U+009B, a terminal's CSI),
- a format character (Cf: bidi overrides and isolates, zero-width spaces and joiners, the BOM),
- a surrogate (Cs), a private-use (Co) or an unassigned (Cn, in Python's Unicode version) code
  point,
- a line or paragraph separator (Zl, Zp: U+2028 and U+2029 break a line as ``\\n`` does),
- or whitespace at either end.

Everything else stays valid, as it was: spaces inside, every script, emails, UUIDs, punctuation.
"Unassigned" is as the Python running the API knows Unicode: 3.11 ships Unicode 14.0, so a
character assigned since (the emoji U+1FA77, Unicode 15) is refused in a new id until it runs on a
later Python. Zero-width joiners and non-joiners (Cf) are refused too, though Persian and Indic
names and emoji sequences use them: an id is matched byte for byte, and an invisible character in
one is how two ids come to look alike.

An identifier stored before the rule keeps working wherever it names what is stored, so no tenant
is locked out of its own data: lookups take it as before (``GET /v1/users/{id}``, a user's
devices and preferences, ``GET /v1/notifications?user=``, a send's ``user_id``), a send repeating
its event id answers as the repeat it is, and ``PUT /v1/users/{id}`` or a send's inline ``user``
update such a user. Only creating one is refused: a new event id, a new user, a new key name, a
new tenant from ``clarion keys create``.
"""

from __future__ import annotations

import unicodedata

from clarion.inert import inert

RULE = "an id may hold only printable characters, and no whitespace at either end"
REFUSED_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "a format character (such as a bidi override or a zero-width mark)",
    "Cs": "a lone surrogate",
    "Co": "a private-use character",
    "Cn": "an unassigned code point",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
}


def unprintable(text: str) -> str | None:
    """Why ``text`` is not a printable id (the first character refused, escaped, and where), or
    None when it is one."""
    # str.isprintable() is False exactly for the categories C* and Z* but the ASCII space: the
    # common id (printable, or with spaces inside) costs one pass in C.
    if not text.isprintable():
        for position, char in enumerate(text):
            kind = REFUSED_CATEGORIES.get(unicodedata.category(char))
            if kind is not None:
                return f"holds {inert(char)} at position {position}, {kind}; {RULE}"
    if text != text.strip():
        return f"starts or ends with whitespace; {RULE}"
    return None


def check_printable_id(text: str) -> str:
    """``text`` when it is a printable id; ``ValueError`` saying why not (for pydantic validators)."""
    problem = unprintable(text)
    if problem is not None:
        raise ValueError(problem)
    return text
