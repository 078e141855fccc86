"""Signed tokens of Clarion's own email tracking: the open pixel ``/t/o/<token>`` and each
rewritten link ``/t/c/<token>``.

A token names the tenant (``t``), the notification (``n``) and, for a click, the link (``l``) it
redirects to. The link lives *in* the signed token, so the redirect can only ever lead to a URL
that Clarion itself put into a message: a token whose link was changed fails its signature, and
there is no token for a URL that was not in the message (no open redirect). Signed with
``CLARION_SECRET_KEY`` under a version prefix of its own (no preference or push token is ever taken
for one) and honoured under the previous keys after a rotation. Tokens do not expire: a link in a
mail read a year later must still lead where it said.

Errors: :class:`InvalidToken` for anything forged, malformed or oversized, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from clarion.engagement_tokens import sign_claims, verify_claims
from clarion.tokens import InvalidToken

_VERSION = b"clarion-email-tracking-v1."
MAX_LINK_CHARS = 2048  # longer links are left as they are, untracked
MAX_TOKEN_CHARS = 2 * MAX_LINK_CHARS  # base64 of the JSON claims (a link is plain ASCII) and a signature

__all__ = ["MAX_LINK_CHARS", "InvalidToken", "TrackingClaims", "make_tracking_token", "verify_tracking_token"]


@dataclass(frozen=True, slots=True)
class TrackingClaims:
    tenant_id: str
    notification_id: UUID
    link: str | None  # None: the open pixel


def make_tracking_token(*, secret: str, tenant_id: str, notification_id: UUID, link: str | None) -> str:
    """The token of ``notification_id``'s open pixel (``link`` None) or of one of its links."""
    claims: dict[str, object] = {"n": str(notification_id), "t": tenant_id}
    if link is not None:
        if len(link) > MAX_LINK_CHARS:
            raise ValueError(f"links over {MAX_LINK_CHARS} characters are not tracked")
        claims["l"] = link
    return sign_claims(version=_VERSION, secret=secret, claims=claims)


def verify_tracking_token(token: str, *, secrets: Sequence[str]) -> TrackingClaims:
    """The claims of a genuine tracking token; else :class:`InvalidToken`."""
    claims = verify_claims(token, version=_VERSION, secrets=secrets, max_chars=MAX_TOKEN_CHARS)
    tenant_id, link = claims.get("t"), claims.get("l")
    try:
        notification_id = UUID(str(claims.get("n")))
    except ValueError:
        raise InvalidToken("malformed claims") from None
    if not isinstance(tenant_id, str) or not (link is None or isinstance(link, str)):
        raise InvalidToken("malformed claims")
    return TrackingClaims(tenant_id, notification_id, link)
