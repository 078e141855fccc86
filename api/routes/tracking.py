"""Clarion's own email tracking: ``GET /t/o/<token>`` (the open pixel) and ``GET /t/c/<token>``
(a rewritten link: recorded, then redirected). No API key: the signed token is the credential."""

from __future__ import annotations

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import RedirectResponse

from api.errors import ApiError
from api.tracking import PIXEL, claims_of, record_hit
from clarion.settings import Settings
from clarion.tracking_tokens import MAX_TOKEN_CHARS, TrackingClaims

router = APIRouter(tags=["tracking"])

# A click token for a link of MAX_LINK_CHARS is ~2,900 characters (claims as base64, a signature).
Token = Path(min_length=1, max_length=MAX_TOKEN_CHARS, pattern=r"^[A-Za-z0-9_\-]+\.[A-Za-z0-9_\-]+$")
_NO_STORE = {"Cache-Control": "no-store, private", "Referrer-Policy": "no-referrer"}


def _secrets(request: Request) -> list[str]:
    settings: Settings = request.app.state.settings
    return [
        settings.secret_key.get_secret_value(),
        *(s.get_secret_value() for s in settings.previous_secret_keys),
    ]


async def _recorded_hit(request: Request, token: str, *, link: bool) -> TrackingClaims:
    """The claims of a pixel's (``link`` False) or a link's token, its hit recorded (or let go:
    ``api.tracking.record_hit``); 404 for the other kind's token."""
    claims = claims_of(token, secrets=_secrets(request))
    if (claims.link is not None) != link:
        message = (
            "a link's, not an open pixel's" if claims.link is not None else "an open pixel's, not a link's"
        )
        raise ApiError(404, "not_found", f"This token is {message}.")
    state = request.app.state
    await record_hit(
        pool=state.pool,
        gate=state.engagement_gate,
        claims=claims,
        user_agent=request.headers.get("user-agent"),
    )
    return claims


@router.get(
    "/t/o/{token}",
    response_class=Response,
    responses={200: {"content": {"image/gif": {}}, "description": "a 1x1 transparent GIF"}},
)
async def open_pixel(request: Request, token: str = Token) -> Response:
    """The open pixel of a tracked email: records an open (or a prefetch) of its notification."""
    await _recorded_hit(request, token, link=False)
    return Response(PIXEL, media_type="image/gif", headers=_NO_STORE)


@router.get("/t/c/{token}", response_class=RedirectResponse, status_code=302)
async def click(request: Request, token: str = Token) -> RedirectResponse:
    """A tracked email's link: records the click (or a link scanner's prefetch) and redirects to the
    link the signed token carries, never anywhere else."""
    claims = await _recorded_hit(request, token, link=True)
    assert claims.link is not None
    return RedirectResponse(claims.link, status_code=302, headers=_NO_STORE)
