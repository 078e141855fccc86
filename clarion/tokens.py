"""Signed, expiring tokens that let a person manage their own preferences without an API key.

A token reads ``<payload>.<signature>``, both base64url without padding. The payload is compact
JSON naming the tenant, the user (Clarion's internal id, so no external id or address leaks into
a URL), the purpose (``unsubscribe`` or ``preferences``), the category (for ``unsubscribe``) and
the expiry (Unix seconds). The signature is HMAC-SHA256 over a version prefix and the payload.

Guarantees of :func:`verify_token`:

- a token is accepted only if its signature matches under the current secret or one of the
  previous secrets (so rotating ``CLARION_SECRET_KEY`` does not break links already sent);
- signatures are compared in constant time (``hmac.compare_digest``);
- an expired token, a token for another purpose, or anything malformed raises
  :class:`InvalidToken`; nothing else is ever raised for bad input.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

Purpose = Literal["unsubscribe", "preferences"]
PURPOSES: frozenset[str] = frozenset({"unsubscribe", "preferences"})
_VERSION = b"clarion-token-v1."
_MAX_TOKEN_CHARS = 2048


class InvalidToken(Exception):
    """The token is forged, expired, malformed or meant for something else."""


@dataclass(frozen=True, slots=True)
class TokenClaims:
    tenant_id: str
    user_id: UUID
    purpose: Purpose
    category: str | None
    expires_at_s: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _sign(secret: str, payload: bytes) -> bytes:
    return hmac.new(secret.encode(), _VERSION + payload, hashlib.sha256).digest()


def make_token(
    *,
    secret: str,
    tenant_id: str,
    user_id: UUID,
    purpose: Purpose,
    ttl_s: float,
    category: str | None = None,
    now_s: float | None = None,
) -> str:
    """A token for ``purpose`` valid for ``ttl_s`` seconds, signed with ``secret``."""
    if purpose not in PURPOSES:
        raise ValueError(f"unknown token purpose {purpose!r}")
    if purpose == "unsubscribe" and not category:
        raise ValueError("an unsubscribe token needs a category")
    expires = int((time.time() if now_s is None else now_s) + ttl_s)
    claims = {"t": tenant_id, "u": str(user_id), "p": purpose, "c": category, "e": expires}
    payload = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    return f"{_b64(payload)}.{_b64(_sign(secret, payload))}"


def verify_token(
    token: str,
    *,
    secrets: Sequence[str],
    purposes: frozenset[str] | set[str],
    now_s: float | None = None,
) -> TokenClaims:
    """The claims of a genuine, unexpired token for one of ``purposes``; else :class:`InvalidToken`.

    ``secrets`` is the current secret first, then previous ones still honoured after a rotation.
    """
    if not token or len(token) > _MAX_TOKEN_CHARS or token.count(".") != 1:
        raise InvalidToken("malformed token")
    payload_text, signature_text = token.split(".")
    try:
        payload = _unb64(payload_text)
        signature = _unb64(signature_text)
    except (binascii.Error, ValueError):
        raise InvalidToken("malformed token") from None
    # Check every secret (no early exit) so timing does not tell which one matched.
    matched = False
    for secret in secrets:
        matched |= hmac.compare_digest(_sign(secret, payload), signature)
    if not matched:
        raise InvalidToken("bad signature")
    try:
        claims = json.loads(payload)
        tenant_id, purpose, category, expires = claims["t"], claims["p"], claims["c"], int(claims["e"])
        user_id = UUID(claims["u"])
    except (ValueError, KeyError, TypeError):
        raise InvalidToken("malformed claims") from None
    if not isinstance(tenant_id, str) or purpose not in purposes or purpose not in PURPOSES:
        raise InvalidToken("token not valid for this use")
    if category is not None and not isinstance(category, str):
        raise InvalidToken("malformed claims")
    if expires <= (time.time() if now_s is None else now_s):
        raise InvalidToken("token expired")
    return TokenClaims(tenant_id, user_id, purpose, category, expires)
