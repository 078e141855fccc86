"""Header values a tenant controls (the subject; a from-name) must stay one header.

The renderer refuses a literal CR or LF in a subject, but an RFC 2047 encoded word
(``=?utf-8?q?Ada=0D=0AReply-To:_attacker@evil.example?=``) carries them past it: Python 3.11.7's
email package decodes such words while folding the header and writes the CR/LF out, so the
message gained a ``Reply-To`` header and an HTML body of the attacker's choosing (CVE-2024-6923).
A relay or client that decodes encoded words could do the same with a SendGrid subject. So
every adapter checks the value *as decoded* before sending, and refuses it for good.
"""

from __future__ import annotations

import re
from email.errors import HeaderParseError
from email.header import decode_header

# C0 controls (CR, LF, NUL...), DEL, and the Unicode line and paragraph separators.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\u2028\u2029]")


def breaks_header(value: str) -> bool:
    """Whether ``value`` holds, or RFC 2047-decodes to, a line break or control character."""
    return bool(_CONTROL.search(value) or ("=?" in value and _CONTROL.search(_decoded(value))))


def _decoded(value: str) -> str:
    """The text a mail client would show; control characters are ASCII in every charset used for
    mail, so a part in an unknown or lying charset is read as Latin-1 rather than trusted."""
    try:
        parts = decode_header(value)
    except HeaderParseError:
        return "\n"  # an encoded word that does not even parse is no subject to send
    text = []
    for part, charset in parts:
        if isinstance(part, str):
            text.append(part)
            continue
        try:
            text.append(part.decode(charset or "latin-1"))
        except (LookupError, UnicodeDecodeError):
            text.append(part.decode("latin-1"))
    return "".join(text)
