"""Signed per-notification tokens a device uses to report a push open or click without an API key.

A token reads ``<payload>.<signature>``, both base64url without padding; the payload is compact JSON
naming the tenant (``t``), the notification (``n``) and the expiry (``e``, Unix seconds). The
signature is HMAC-SHA256 under ``CLARION_SECRET_KEY`` over a version prefix of its own, so neither a
preference token (``clarion.tokens``) nor any other signed string of Clarion's is ever taken for
one, and the reverse.

Guarantees of :func:`verify_engagement_token`:

- accepted only if its signature matches under the current secret or one of the previous ones
  (rotating ``CLARION_SECRET_KEY`` does not break pushes already delivered), compared in constant
  time and against every secret;
- a forged, expired, oversized or malformed token raises :class:`InvalidToken`, nothing else.
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
from uuid import UUID

from clarion.tokens import InvalidToken

_VERSION = b"clarion-engagement-v1."
MAX_TOKEN_CHARS = 512
# The key of the push payload's data that carries the token (APNs: beside "aps"; FCM: in "data").
PUSH_DATA_KEY = "clarion_event_token"

__all__ = ["MAX_TOKEN_CHARS", "PUSH_DATA_KEY", "EngagementClaims", "InvalidToken"]


@dataclass(frozen=True, slots=True)
class EngagementClaims:
    tenant_id: str
    notification_id: UUID
    expires_at_s: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign_claims(*, version: bytes, secret: str, claims: dict[str, object]) -> str:
    """``claims`` as compact JSON, signed under ``version`` (each kind of token has its own)."""
    payload = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    signature = hmac.new(secret.encode(), version + payload, hashlib.sha256).digest()
    return f"{_b64(payload)}.{_b64(signature)}"


def verify_claims(token: str, *, version: bytes, secrets: Sequence[str], max_chars: int) -> dict[str, object]:
    """The JSON object a genuine token of ``version`` signs; else :class:`InvalidToken`.

    ``secrets`` is the current secret first, then previous ones still honoured after a rotation.
    """
    if not token or len(token) > max_chars or token.count(".") != 1 or not token.isascii():
        raise InvalidToken("malformed token")
    payload_text, signature_text = token.split(".")
    try:
        payload = base64.urlsafe_b64decode(payload_text + "=" * (-len(payload_text) % 4))
        signature = base64.urlsafe_b64decode(signature_text + "=" * (-len(signature_text) % 4))
    except (binascii.Error, ValueError):
        raise InvalidToken("malformed token") from None
    matched = False
    for secret in secrets:  # no early exit: timing does not tell which secret matched
        expected = hmac.new(secret.encode(), version + payload, hashlib.sha256).digest()
        matched |= hmac.compare_digest(expected, signature)
    if not matched:
        raise InvalidToken("bad signature")
    try:
        claims = json.loads(payload)
    except ValueError:
        raise InvalidToken("malformed claims") from None
    if not isinstance(claims, dict):
        raise InvalidToken("malformed claims")
    return claims


def make_engagement_token(
    *, secret: str, tenant_id: str, notification_id: UUID, ttl_s: float, now_s: float | None = None
) -> str:
    """A token for reporting engagement on ``notification_id``, valid ``ttl_s`` seconds."""
    expires = int((time.time() if now_s is None else now_s) + ttl_s)
    claims: dict[str, object] = {"e": expires, "n": str(notification_id), "t": tenant_id}
    return sign_claims(version=_VERSION, secret=secret, claims=claims)


def verify_engagement_token(
    token: str, *, secrets: Sequence[str], now_s: float | None = None
) -> EngagementClaims:
    """The claims of a genuine, unexpired engagement token; else :class:`InvalidToken`.

    ``secrets`` is the current secret first, then previous ones still honoured after a rotation.
    """
    claims = verify_claims(token, version=_VERSION, secrets=secrets, max_chars=MAX_TOKEN_CHARS)
    try:
        tenant_id, expires = claims["t"], int(claims["e"])  # type: ignore[call-overload]
        notification_id = UUID(str(claims["n"]))
    except (ValueError, KeyError, TypeError):
        raise InvalidToken("malformed claims") from None
    if not isinstance(tenant_id, str):
        raise InvalidToken("malformed claims")
    if expires <= (time.time() if now_s is None else now_s):
        raise InvalidToken("token expired")
    return EngagementClaims(tenant_id, notification_id, expires)
