"""Standard Webhooks signatures (https://www.standardwebhooks.com/): what a receiver verifies.

Every delivery carries ``webhook-id`` (the event id: the same on every retry and replay, so a
receiver can drop duplicates), ``webhook-timestamp`` (Unix seconds of this call) and
``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``, keyed with the
base64-decoded part of the endpoint's ``whsec_...`` secret. Just after a rotation the header holds
two signatures separated by a space, the new secret's first, so a receiver still on the old secret
keeps verifying until it switches. The ``standardwebhooks`` package verifies all of this.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"


def new_secret() -> str:
    """A fresh endpoint secret: ``whsec_`` and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def sign(*, secret: str, msg_id: str, timestamp_s: int, body: str) -> str:
    """One ``v1,<base64>`` signature of ``body`` under ``secret``."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    digest = hmac.new(key, f"{msg_id}.{timestamp_s}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(*, secrets: Sequence[str], msg_id: str, timestamp_s: int, body: str) -> dict[str, str]:
    """The three Standard Webhooks headers, one signature per secret in ``secrets``."""
    signatures = " ".join(sign(secret=s, msg_id=msg_id, timestamp_s=timestamp_s, body=body) for s in secrets)
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp_s), "webhook-signature": signatures}
