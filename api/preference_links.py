"""The signed links that let a person manage their own preferences, and checking their tokens.

A user-side request with a forged, expired or misused token, or one whose user no longer exists,
is refused with ``403 invalid_token`` and changes nothing. Tokens signed with a previous secret
key (``previous_secret_keys``) are still accepted, so keys can be rotated.
"""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

import sqlalchemy as sa
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncEngine

from api.errors import ApiError
from api.users import user_id_for
from clarion.settings import Settings
from clarion.tokens import InvalidToken, TokenClaims, make_token, verify_token
from schema.models import User

_users = User.__table__  # type: ignore[attr-defined]


def _secrets(settings: Settings) -> list[str]:
    return [
        settings.secret_key.get_secret_value(),
        *(s.get_secret_value() for s in settings.previous_secret_keys),
    ]


def invalid_token() -> ApiError:
    return ApiError(403, "invalid_token", "This link is invalid or has expired.")


def verified_claims(*, settings: Settings, token: str | None, purposes: set[str]) -> TokenClaims:
    """The verified claims of a user-side token, without the database; else ``403 invalid_token``."""
    try:
        return verify_token(token or "", secrets=_secrets(settings), purposes=purposes)
    except InvalidToken:
        raise invalid_token() from None


async def known_user(*, engine: AsyncEngine, claims: TokenClaims) -> None:
    """``403 invalid_token`` when the token's user no longer exists."""
    async with engine.connect() as conn:
        exists = (
            await conn.execute(
                sa.select(sa.literal(1)).where(
                    _users.c.id == claims.user_id, _users.c.tenant_id == claims.tenant_id
                )
            )
        ).first()
    if exists is None:
        raise invalid_token()


class PreferencesLink(BaseModel):
    url: str
    token: str
    expires_at: datetime


def preferences_link(*, settings: Settings, tenant_id: str, user_id: UUID) -> PreferencesLink:
    """A signed link to the user's preference page, valid ``preference_token_ttl_s``."""
    token = make_token(
        secret=settings.secret_key.get_secret_value(),
        tenant_id=tenant_id,
        user_id=user_id,
        purpose="preferences",
        ttl_s=settings.preference_token_ttl_s,
    )
    expires = datetime.now(UTC).timestamp() + settings.preference_token_ttl_s
    return PreferencesLink(
        url=f"{settings.base_url.rstrip('/')}/preferences?token={token}",
        token=token,
        expires_at=datetime.fromtimestamp(int(expires), UTC),
    )


async def user_preferences_link(
    *, engine: AsyncEngine, settings: Settings, tenant_id: str, external_id: str
) -> PreferencesLink:
    """A signed preference-page link for a user named by external id (404 ``unknown_user``)."""
    async with engine.connect() as conn:
        user_id = await user_id_for(conn, tenant_id=tenant_id, external_id=external_id)
    return preferences_link(settings=settings, tenant_id=tenant_id, user_id=user_id)
