"""Forged user-side tokens refused before the router (``api/token_first.py``): the route's answer
(the error body, or its page), without the route ever being called; a token that verifies, and
every other request, goes on to the app."""

from __future__ import annotations

from uuid import uuid4

import httpx
from starlette.responses import HTMLResponse, JSONResponse
from starlette.types import Receive, Scope, Send

from api.errors import ApiError
from api.token_first import TokenFirst, UserSideRoute
from clarion.settings import Settings
from clarion.tokens import make_token
from harness.services import ApiServer, api_client
from tests.fixtures.answers import assert_error

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
