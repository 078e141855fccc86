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


def _sign(secret: str, payload: bytes) -> bytes:
    return hmac.new(secret.encode(), _VERSION + payload, hashlib.sha256).digest()


def make_engagement_token(
    *, secret: str, tenant_id: str, notification_id: UUID, ttl_s: float, now_s: float | None = None
) -> str:
    """A token for reporting engagement on ``notification_id``, valid ``ttl_s`` seconds."""
    expires = int((time.time() if now_s is None else now_s) + ttl_s)
    claims = {"e": expires, "n": str(notification_id), "t": tenant_id}
    payload = json.dumps(claims, separators=(",", ":"), sort_keys=True).encode()
    return f"{_b64(payload)}.{_b64(_sign(secret, payload))}"


def verify_engagement_token(
    token: str, *, secrets: Sequence[str], now_s: float | None = None
) -> EngagementClaims:
    """The claims of a genuine, unexpired engagement token; else :class:`InvalidToken`.

    ``secrets`` is the current secret first, then previous ones still honoured after a rotation.
    """
    if not token or len(token) > MAX_TOKEN_CHARS or token.count(".") != 1 or not token.isascii():
        raise InvalidToken("malformed token")
    payload_text, signature_text = token.split(".")
    try:
        payload = base64.urlsafe_b64decode(payload_text + "=" * (-len(payload_text) % 4))
        signature = base64.urlsafe_b64decode(signature_text + "=" * (-len(signature_text) % 4))
    except (binascii.Error, ValueError):
        raise InvalidToken("malformed token") from None
    matched = False
    for secret in secrets:  # no early exit: timing does not tell which secret matched
        matched |= hmac.compare_digest(_sign(secret, payload), signature)
    if not matched:
        raise InvalidToken("bad signature")
    try:
        claims = json.loads(payload)
        tenant_id, expires = claims["t"], int(claims["e"])
        notification_id = UUID(claims["n"])
    except (ValueError, KeyError, TypeError):
        raise InvalidToken("malformed claims") from None
    if not isinstance(tenant_id, str):
        raise InvalidToken("malformed claims")
    if expires <= (time.time() if now_s is None else now_s):
        raise InvalidToken("token expired")
    return EngagementClaims(tenant_id, notification_id, expires)
