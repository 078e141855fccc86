"""The hot route's shortcut answers exactly as the router would: same endpoint, same error handlers."""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from api.fast_route import FastRoute


class Refused(Exception):
    pass


class RefusedHard(Refused):
    pass


def make_app() -> FastAPI:
    app = FastAPI()
    calls: list[str] = []

    async def endpoint(request: Request) -> Response:
        calls.append("fast")
        body = await request.json()
        if body.get("fail") == "refused":
            raise RefusedHard("no")
        if body.get("fail") == "bug":
            raise RuntimeError("bug")
        return JSONResponse({"echo": body}, status_code=202)

    @app.post("/send")
    async def routed(request: Request) -> Response:
        calls.append("router")
        return await endpoint(request)

    @app.get("/send")
    async def listing() -> dict[str, str]:
        return {"route": "list"}

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"error": {"code": "refused", "message": str(exc)}}, status_code=422)

    app.add_middleware(
        FastRoute, method="POST", path="/send", endpoint=endpoint, handlers=app.exception_handlers
    )
    app.state.calls = calls
    return app


async def test_the_hot_route_skips_the_router_and_other_methods_do_not() -> None:
    app = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        sent = await client.post("/send", json={"a": 1})
        listed = await client.get("/send")
    assert (sent.status_code, sent.json()) == (202, {"echo": {"a": 1}})
    assert listed.json() == {"route": "list"}
    assert app.state.calls == ["fast"]


async def test_errors_are_answered_by_the_apps_handler_for_the_nearest_base_class() -> None:
    app = make_app()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        refused = await client.post("/send", json={"fail": "refused"})
    assert refused.status_code == 422
    assert refused.json() == {"error": {"code": "refused", "message": "no"}}


async def test_an_error_without_a_handler_reaches_the_server_error_middleware() -> None:
    app = make_app()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        answer = await client.post("/send", json={"fail": "bug"})
    assert answer.status_code == 500
    with pytest.raises(RuntimeError, match="bug"):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            await c.post("/send", json={"fail": "bug"})
