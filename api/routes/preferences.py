"""Preferences: service-side (API key, ``preferences`` scope) and user-side (a signed token).

- ``GET/PUT /v1/users/{external_id}/preferences`` and ``POST .../preferences/link`` (service side);
- ``GET/POST /v1/preferences?token=`` and the page at ``/preferences?token=`` (the person);
- ``POST /v1/unsubscribe?token=``: RFC 8058 one-click unsubscribe from the email's
  ``List-Unsubscribe`` header. A ``GET`` of that URL never unsubscribes: it shows a page whose one
  button posts the same token.

The user-side routes need no API key: each checks its token first, without the database, then
takes a turn of its tenant's share of the pool (``api.preference_gate``): ``403 invalid_token``,
``429 preferences_busy`` (an HTML page on the pages). The service side's reads and writes take
turns too, of a gate of their own: ``429 preferences_busy`` past them.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from html import escape
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, Response
from fastapi.routing import APIRoute

from api.auth import require
from api.errors import ApiError
from api.preference_gate import keyed_turn, user_side_turn
from api.preference_links import PreferencesLink, known_user, user_preferences_link
from api.preferences import (
    PreferencesIn,
    PreferencesOut,
    get_preferences,
    replace_user_preferences,
    set_preferences,
    unsubscribe,
    user_preferences,
)
from api.token_first import UserSideRoute
from clarion import metrics
from clarion.tenants import Principal
from clarion.tokens import TokenClaims

router = APIRouter(tags=["preferences"])

# Each user-side route and its token's purpose, read twice: by ``api.token_first`` before the router,
# and by the route itself (``_turn``), which looks its own entry up: one table, no second spelling.
USER_SIDE = {
    ("GET", "/v1/preferences"): UserSideRoute("preferences", page=False),
    ("POST", "/v1/preferences"): UserSideRoute("preferences", page=False),
    ("POST", "/v1/unsubscribe"): UserSideRoute("unsubscribe", page=False),
    ("GET", "/v1/unsubscribe"): UserSideRoute("unsubscribe", page=True),
    ("GET", "/preferences"): UserSideRoute("preferences", page=True),
}

STATIC = Path(__file__).resolve().parents[1] / "static"
ExternalId = Annotated[str, PathParam(min_length=1, max_length=255)]
Token = Annotated[str | None, Query(max_length=2048, description="the signed token from the link")]

# The page carries a bearer token in its URL: never leak it in a Referer, never cache, never frame.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}


@router.get("/v1/users/{external_id}/preferences", response_model=PreferencesOut)
async def read_user_preferences(
    external_id: ExternalId,
    request: Request,
    principal: Annotated[Principal, Depends(require("preferences"))],
) -> PreferencesOut:
    async with keyed_turn(gate=request.app.state.keyed_preference_gate, tenant_id=principal.tenant_id):
        return await user_preferences(
            engine=request.app.state.engine, tenant_id=principal.tenant_id, external_id=external_id
        )


@router.put("/v1/users/{external_id}/preferences", response_model=PreferencesOut)
async def replace_preferences(
    external_id: ExternalId,
    body: PreferencesIn,
    request: Request,
    principal: Annotated[Principal, Depends(require("preferences"))],
) -> PreferencesOut:
    async with keyed_turn(gate=request.app.state.keyed_preference_gate, tenant_id=principal.tenant_id):
        return await replace_user_preferences(
            engine=request.app.state.engine,
            tenant_id=principal.tenant_id,
            external_id=external_id,
            entries=body.preferences,
        )


@router.post("/v1/users/{external_id}/preferences/link", response_model=PreferencesLink)
async def make_link(
    external_id: ExternalId,
    request: Request,
    principal: Annotated[Principal, Depends(require("preferences"))],
) -> PreferencesLink:
    """A signed link the user can open to manage their own preferences, no API key needed."""
    return await user_preferences_link(
        engine=request.app.state.engine,
        settings=request.app.state.settings,
        tenant_id=principal.tenant_id,
        external_id=external_id,
    )


@router.get("/v1/preferences", response_model=PreferencesOut, tags=["user-side"])
async def read_own_preferences(request: Request, token: Token = None) -> PreferencesOut:
    state = request.app.state
    async with _turn(request, token) as claims:
        await known_user(engine=state.engine, claims=claims)
        return await get_preferences(engine=state.engine, tenant_id=claims.tenant_id, user_id=claims.user_id)


@router.post("/v1/preferences", response_model=PreferencesOut, tags=["user-side"])
async def change_own_preferences(
    body: PreferencesIn, request: Request, token: Token = None
) -> PreferencesOut:
    state = request.app.state
    async with _turn(request, token) as claims:
        await known_user(engine=state.engine, claims=claims)
        return await set_preferences(
            engine=state.engine,
            tenant_id=claims.tenant_id,
            user_id=claims.user_id,
            entries=body.preferences,
            replace=False,
        )


@router.post("/v1/unsubscribe", tags=["user-side"])
async def one_click_unsubscribe(request: Request, token: Token = None) -> dict[str, object]:
    """RFC 8058 one-click: the body (``List-Unsubscribe=One-Click``) carries no authority; the
    token does. Idempotent: a repeat changes nothing and writes nothing. Never refused as busy
    (``api.preference_gate``): the sender's POST is made once."""
    async with _turn(request, token, one_click=True) as claims:
        assert claims.category is not None
        await unsubscribe(
            engine=request.app.state.engine,
            tenant_id=claims.tenant_id,
            user_id=claims.user_id,
            category=claims.category,
        )
    metrics.UNSUBSCRIBES.labels(claims.tenant_id).inc()
    return {"unsubscribed": True, "channel": "email", "category": claims.category}


@router.get("/v1/unsubscribe", response_class=HTMLResponse, tags=["user-side"])
async def unsubscribe_link_opened(request: Request, token: Token = None) -> Response:
    """Opening the link (a GET, as link scanners do too) changes nothing: it shows a page whose one
    button posts the same token. The token keeps its reach: one category's unsubscribe link never
    becomes a token for the whole preference page (it did, valid 60 days)."""
    try:
        async with _turn(request, token) as claims:
            await known_user(engine=request.app.state.engine, claims=claims)
    except ApiError as exc:
        return error_page(exc)
    category = escape(claims.category or "these")
    action = escape(f"/v1/unsubscribe?token={token}", quote=True)
    body = (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>Unsubscribe</title></head>"
        f"<body><h1>Unsubscribe from {category} emails?</h1>"
        f"<form method='post' action='{action}'>"
        "<input type='hidden' name='List-Unsubscribe' value='One-Click'>"
        "<button type='submit'>Unsubscribe</button></form></body></html>"
    )
    return HTMLResponse(body, headers=PAGE_HEADERS)


@router.get("/preferences", response_class=HTMLResponse, tags=["user-side"])
async def preference_page(request: Request, token: Token = None) -> Response:
    try:
        async with _turn(request, token) as claims:
            await known_user(engine=request.app.state.engine, claims=claims)
    except ApiError as exc:
        return error_page(exc)
    return HTMLResponse((STATIC / "preferences.html").read_text(encoding="utf-8"), headers=PAGE_HEADERS)


@router.get("/preferences/preferences.js", include_in_schema=False)
async def preference_page_script() -> Response:
    return Response(
        (STATIC / "preferences.js").read_text(encoding="utf-8"),
        media_type="text/javascript",
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )


def _turn(
    request: Request, token: str | None, *, one_click: bool = False
) -> AbstractAsyncContextManager[TokenClaims]:
    """The route's own check of its token, for the purpose its ``USER_SIDE`` entry names (found by
    the route that matched, not the raw path ``TokenFirst`` saw), then its tenant's turn."""
    state = request.app.state
    route: APIRoute = request.scope["route"]
    return user_side_turn(
        gate=state.preference_gate,
        settings=state.settings,
        token=token,
        purposes={USER_SIDE[(request.method, route.path)].purpose},
        one_click=one_click,
    )


def error_page(exc: ApiError) -> HTMLResponse:
    """The refusal as a page a person can read: a link that is no longer valid, or a moment to wait."""
    title = "Please try again in a moment" if exc.status == 429 else "Link not valid"
    advice = "Reload this page shortly." if exc.status == 429 else "Use the link in a more recent message."
    body = (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title}</title></head>"
        f"<body><h1>{title}</h1><p>{escape(exc.message)}</p><p>{advice}</p></body></html>"
    )
    return HTMLResponse(body, status_code=exc.status, headers={**PAGE_HEADERS, **(exc.headers or {})})
