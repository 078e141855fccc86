"""Verifying a SendGrid Event Webhook batch: SendGrid's ECDSA P-256 signature over timestamp + raw
body (docs/providers.md 4.5), made at most ``SENDGRID_MAX_AGE_S`` ago so an old batch cannot be
replayed.
"""

from __future__ import annotations

import base64
import binascii
import functools
import time

from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey
from sendgrid.helpers.eventwebhook import EventWebhook

from api.errors import ApiError

SENDGRID_MAX_AGE_S = 600.0
SENDGRID_SIGNATURE_HEADER = "X-Twilio-Email-Event-Webhook-Signature"
SENDGRID_TIMESTAMP_HEADER = "X-Twilio-Email-Event-Webhook-Timestamp"


@functools.lru_cache(maxsize=4)
def _ecdsa_key(public_key: str) -> EllipticCurvePublicKey:
    key = EventWebhook().convert_public_key_to_ecdsa(public_key)
    assert isinstance(key, EllipticCurvePublicKey)
    return key


def sendgrid_signature_valid(
    *,
    public_key: str,
    payload: bytes,
    signature: str | None,
    timestamp: str | None,
    now_s: float | None = None,
    max_age_s: float = SENDGRID_MAX_AGE_S,
) -> bool:
    """Whether ``signature`` is SendGrid's over ``timestamp`` + the raw ``payload`` for the base64 DER
    ``public_key`` (via the SDK's ``EventWebhook``), and the timestamp is at most ``max_age_s``
    seconds from now (an old, replayed batch is refused)."""
    if not signature or not timestamp:
        return False
    try:
        age_s = (time.time() if now_s is None else now_s) - int(timestamp)
        if abs(age_s) > max_age_s:
            return False
        key = _ecdsa_key(public_key)
        return bool(EventWebhook().verify_signature(payload.decode("utf-8"), signature, timestamp, key))
    except (ValueError, TypeError, binascii.Error):
        return False


def check_key(public_key: str) -> None:
    """``503 not_configured`` when ``public_key`` is not a base64 DER public key."""
    try:
        base64.b64decode(public_key, validate=True)
        _ecdsa_key(public_key)
    except (ValueError, TypeError, binascii.Error) as exc:
        raise ApiError(
            503, "not_configured", "The configured SendGrid webhook public key is not a valid key."
        ) from exc
