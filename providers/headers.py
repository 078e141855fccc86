"""Adapters refuse a header value that could become more than one header (``core.headers``)."""

from __future__ import annotations

from core.headers import breaks_header
from providers.errors import PermanentProviderError


def check_header_value(value: str, *, provider: str, field: str) -> str:
    """``value`` unchanged, or ``PermanentProviderError(code="header_injection")`` when it, or its
    RFC 2047-decoded form, holds a line break or another control character."""
    if breaks_header(value):
        raise PermanentProviderError(
            f"the {field} holds a line break or control character (possibly inside an RFC 2047 "
            "encoded word): it could add headers or a body to the email",
            provider=provider,
            code="header_injection",
        )
    return value
