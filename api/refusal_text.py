"""What a refusal may say of the caller's own input: a bounded excerpt, inert.

A 4xx quotes what it refuses: a user or event id (``No user 'u-1'``), a value (``'+1 555' is not
an E.164 phone number``), a field's path, which holds the caller's own keys (an unknown key, a
``data`` key), pydantic's own words (``found `x` at 0`` for a bad UUID) and Jinja's (``Encountered
unknown tag 'x'``). Until 2026-11-28 each was quoted raw, most whole, and a helper's probe measured:

- C1 controls and bidi overrides went out as sent (JSON escapes only U+0000-U+001F, and a client
  that prints the decoded message prints those raw too): ``\\x1b]52;`` clipboard writes, U+202E;
- an unknown ``provider`` of 14,700 characters came back twice, 53 KB; so did an unknown key of
  that size; a Jinja tag or variable name of 30,000 characters, 30-60 KB;
- a send of 7,000 unknown keys (59 KB) came back as 591 KB, one detail per key; a batch of 1,000
  such items (3.9 MB) as 41 MB, in 5.8 s.

So every error body passes through `bounded` (``api.errors.error_body``, which the exception
handlers, a batch's per-item refusals and the middlewares' refusals all use): each text in it is an
`excerpt` of at most ``MAX_TEXT_CHARS``. A message quoting one value quotes it with `shown` (at most
``MAX_QUOTE_CHARS``). A 422 lists at most ``MAX_LISTED_ERRORS`` of pydantic's errors and counts the
rest, each cut to its field (each part of the path at most ``MAX_QUOTE_CHARS``), message and type:
never pydantic's ``input`` or ``ctx`` (``api.errors.validation_error``).
"""

from __future__ import annotations

from typing import Any

from clarion.inert import inert

MAX_QUOTE_CHARS = 100
MAX_TEXT_CHARS = 500  # Clarion's own longest refusal is ~270 characters (a 255-character user id quoted)
MAX_LISTED_ERRORS = 20


def excerpt(text: str, limit: int) -> str:
    """At most ``limit`` characters of ``text`` (then ``...``), each one a person can read without
    harm: non-printable characters as their escapes (`clarion.inert`), a lone surrogate as U+FFFD
    (a response holding one cannot be encoded as UTF-8: the refusal itself was a 500)."""
    cut = len(text) > limit
    head = text[:limit] if cut else text
    if not head.isprintable():
        head = inert(_without_surrogates(head))
        if len(head) > limit:
            head, cut = head[:limit], True
    return f"{head}..." if cut else head


def shown(value: str, limit: int = MAX_QUOTE_CHARS) -> str:
    """``value`` quoted in a message: ``'...'`` around its `excerpt`. A validator's message must
    quote no more, and before pydantic sees it: pydantic's Rust core refuses a message holding a lone
    surrogate with ``UnicodeEncodeError``, which made the refusal a 500."""
    return f"'{excerpt(value, limit)}'"


def bounded(value: Any) -> Any:
    """An error's message or details with every text in it (keys too) an `excerpt` of
    ``MAX_TEXT_CHARS``."""
    if isinstance(value, str):
        return excerpt(value, MAX_TEXT_CHARS)
    if isinstance(value, dict):
        return {bounded(k): bounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [bounded(v) for v in value]
    return value


def _without_surrogates(text: str) -> str:
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        # Through UTF-16, where a lone surrogate is two bytes its decoder can replace.
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
