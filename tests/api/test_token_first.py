"""Forged user-side tokens refused before the router (``api/token_first.py``): the route's answer
(the error body, or its page), without the route ever being called; a token that verifies, and
every other request, goes on to the app."""

from __future__ import annotations

from uuid import uuid4

import httpx
import pytest
from fastapi.routing import APIRoute
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.responses import HTMLResponse, JSONResponse
from starlette.types import Receive, Scope, Send

from api.allow import flat_routes
from api.errors import ApiError
from api.routes.preferences import USER_SIDE
from api.token_first import TokenFirst, UserSideRoute
from clarion.settings import Settings
from clarion.tokens import make_token
from harness.services import ApiServer, api_client
from tests.conftest import TenantInfo
from tests.fixtures.answers import assert_error
from tests.fixtures.preferences import internal_id, new_user, token_for

SETTINGS = Settings(env="test")
ROUTES = {
    ("POST", "/v1/unsubscribe"): UserSideRoute("unsubscribe", page=False),
    ("GET", "/preferences"): UserSideRoute("preferences", page=True),
}


def token(purpose: str, secret: str = SETTINGS.secret_key.get_secret_value()) -> str:
    category = "news" if purpose == "unsubscribe" else None
    return make_token(
        secret=secret,
        tenant_id="t-a",
        user_id=uuid4(),
        purpose=purpose,
        ttl_s=60,
        category=category,  # type: ignore[arg-type]
    )


def client() -> tuple[httpx.AsyncClient, list[str]]:
    reached: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(f"{scope['method']} {scope['path']}")
        await JSONResponse({"reached": True})(scope, receive, send)

    def page(exc: ApiError) -> HTMLResponse:
        return HTMLResponse(f"<h1>{exc.message}</h1>", status_code=exc.status)

    gated = TokenFirst(app, settings=SETTINGS, routes=ROUTES, page=page)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gated), base_url="http://api"), reached


async def test_a_forged_token_is_refused_as_the_route_would_without_reaching_it() -> None:
    forged = [token("unsubscribe", secret="not-the-secret"), token("preferences"), "x" * 3000, "", None]
    anonymous, reached = client()
    async with anonymous:
        for bad in forged:
            params = {} if bad is None else {"token": bad}
            assert_error(await anonymous.post("/v1/unsubscribe", params=params), 403, "invalid_token")
        page = await anonymous.get("/preferences", params={"token": token("unsubscribe")})
        assert page.status_code == 403 and page.text.startswith("<h1>This link is invalid")
        # The last ``token`` is the one the route reads: a good one before a forged one is no pass.
        query = f"token={token('unsubscribe')}&token=forged"
        assert_error(await anonymous.post(f"/v1/unsubscribe?{query}"), 403, "invalid_token")
    assert reached == []


async def test_a_token_that_verifies_and_every_other_request_reach_the_app() -> None:
    anonymous, reached = client()
    async with anonymous:
        assert (
            await anonymous.post("/v1/unsubscribe", params={"token": token("unsubscribe")})
        ).status_code == 200
        assert (
            await anonymous.get("/preferences", params={"token": token("preferences")})
        ).status_code == 200
        assert (await anonymous.get("/v1/unsubscribe", params={"token": "forged"})).status_code == 200
        assert (await anonymous.post("/v1/notifications")).status_code == 200
    assert reached == [
        "POST /v1/unsubscribe",
        "GET /preferences",
        "GET /v1/unsubscribe",
        "POST /v1/notifications",
    ]


async def test_in_the_api_a_forged_token_is_refused_before_its_body_or_length_is_checked(
    api: ApiServer,
) -> None:
    """The app's own wiring: the route alone answered these 400 ``malformed_json`` and 422
    ``validation_error`` (JSON, on a page too); refused first, each is the 403 a forged token gets."""
    async with api_client(api.url, None) as anonymous:
        malformed = await anonymous.post(
            "/v1/preferences",
            params={"token": token("unsubscribe")},
            content=b"{not json",
            headers={"Content-Type": "application/json"},
        )
        assert_error(malformed, 403, "invalid_token")
        assert_error(
            await anonymous.get("/v1/preferences", params={"token": "x" * 3000}), 403, "invalid_token"
        )
        page = await anonymous.get("/preferences", params={"token": "x" * 3000})
        assert page.status_code == 403 and "Link not valid" in page.text, page.text


def user_side_routes(api: ApiServer) -> set[tuple[str, str]]:
    routes = [r for r, _ in flat_routes(api.app.routes) if isinstance(r, APIRoute) and "user-side" in r.tags]
    return {(method, r.path) for r in routes for method in r.methods}


def token_first_of(api: ApiServer) -> TokenFirst:
    """The running app's ``TokenFirst``, found down its middleware stack."""
    layer = api.app.middleware_stack
    while not isinstance(layer, TokenFirst):
        layer = layer.app
    return layer


def test_the_table_token_first_checks_names_every_user_side_route_and_no_other(api: ApiServer) -> None:
    """A user-side route missing from ``USER_SIDE`` would skip the refusal up front (and fail its
    own lookup); an entry with no route would guard nothing."""
    assert user_side_routes(api) == set(USER_SIDE)


OTHER = {"preferences": "unsubscribe", "unsubscribe": "preferences"}


@pytest.mark.parametrize("key", sorted(USER_SIDE), ids=" ".join)
async def test_behind_token_first_each_route_checks_its_token_for_the_purpose_the_table_names(
    api: ApiServer,
    engine: AsyncEngine,
    tenant: TenantInfo,
    monkeypatch: pytest.MonkeyPatch,
    key: tuple[str, str],
) -> None:
    """The route's second check reads the same table: with its entry's purpose swapped and
    ``TokenFirst`` checking nothing, the route alone refuses a token of the purpose it had and takes
    one of the swapped purpose. A purpose written again in the route would not follow the table."""
    async with api_client(api.url, tenant.key) as client:
        await new_user(client)
    user_id = await internal_id(engine, tenant.id, "u-pref")
    method, path = key
    monkeypatch.setattr(token_first_of(api), "routes", {})

    def token_of(purpose: str) -> str:
        return token_for(api.settings, tenant.id, user_id, purpose, category="news")

    was = USER_SIDE[key].purpose
    monkeypatch.setitem(USER_SIDE, key, UserSideRoute(OTHER[was], page=USER_SIDE[key].page))
    async with api_client(api.url, None) as alone:
        refused = await alone.request(method, path, params={"token": token_of(was)}, json={"preferences": []})
        taken = await alone.request(
            method, path, params={"token": token_of(OTHER[was])}, json={"preferences": []}
        )
    assert refused.status_code == 403, refused.text
    assert taken.status_code == 200, taken.text
