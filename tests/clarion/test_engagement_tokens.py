"""The push's event token: genuine ones verify under the current or a previous secret, anything
forged, expired, oversized, of another kind or malformed raises InvalidToken and nothing else."""

from __future__ import annotations

import time
import uuid

import pytest

from clarion.engagement_tokens import (
    MAX_TOKEN_CHARS,
    InvalidToken,
    make_engagement_token,
    verify_engagement_token,
)
from clarion.tokens import make_token

NID = uuid.UUID("0193a8c2-0000-7000-8000-000000000001")


def test_a_genuine_token_names_its_tenant_and_notification() -> None:
    token = make_engagement_token(secret="s1", tenant_id="acme", notification_id=NID, ttl_s=60)
    claims = verify_engagement_token(token, secrets=["s1"])
    assert (claims.tenant_id, claims.notification_id) == ("acme", NID)
    assert len(token) < 200  # it rides in a 4 KB push payload


def test_a_token_signed_before_a_rotation_still_verifies() -> None:
    token = make_engagement_token(secret="old", tenant_id="acme", notification_id=NID, ttl_s=60)
    assert verify_engagement_token(token, secrets=["new", "old"]).notification_id == NID
    with pytest.raises(InvalidToken):
        verify_engagement_token(token, secrets=["new"])


def test_an_expired_token_is_refused() -> None:
    token = make_engagement_token(
        secret="s1", tenant_id="acme", notification_id=NID, ttl_s=60, now_s=time.time() - 120
    )
    with pytest.raises(InvalidToken, match="expired"):
        verify_engagement_token(token, secrets=["s1"])


def _forged_payload() -> str:
    genuine = make_engagement_token(secret="s1", tenant_id="acme", notification_id=NID, ttl_s=60)
    other = make_engagement_token(secret="s1", tenant_id="evil", notification_id=NID, ttl_s=60)
    return other.split(".")[0] + "." + genuine.split(".")[1]


@pytest.mark.parametrize(
    "token",
    [
        "",
        "abc",
        "a.b.c",
        "!!!.???",
        "x" * (MAX_TOKEN_CHARS + 1),
        "é.é",
        _forged_payload(),
        # a preference token, signed with the same secret, is not an event token
        make_token(secret="s1", tenant_id="acme", user_id=NID, purpose="preferences", ttl_s=60),
    ],
)
def test_a_forged_or_malformed_token_raises_invalid_token_only(token: str) -> None:
    with pytest.raises(InvalidToken):
        verify_engagement_token(token, secrets=["s1"])
