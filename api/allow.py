"""``405 Method Not Allowed`` with an ``Allow`` header naming every method of the path.

Starlette answers a method a route lacks with that one route's methods (``GET /v1/users/x`` and
``PUT /v1/users/x`` are two routes: a DELETE got ``Allow: GET``), and a path that also fits a
parameterised route goes there instead (``GET /v1/notifications/batch`` reached
``GET /v1/notifications/{id}`` and answered 422 for the id ``batch``). This middleware, around the
router, answers 405 for a literal path none of whose routes takes the method, and names in a
405's ``Allow`` the methods of the most literal routes that fit (a fixed segment beats a
parameter).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import fastapi.routing
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import error_response

# FastAPI >= 0.165 keeps included routers whole; this walks them as its router does (older
# versions copied every route into the app's list).
_iter_routes_with_context = getattr(fastapi.routing, "_iter_routes_with_context", None)


def flat_routes(routes: Sequence[BaseRoute]) -> Iterator[tuple[BaseRoute, BaseRoute]]:
    """Every route of the app as ``(declared route, route as matched)``, included routers walked."""
    if _iter_routes_with_context is None:
        for route in routes:
            yield route, route
        return
    for route, context in _iter_routes_with_context(routes):
        matched = context.starlette_route if context is not None else None
        yield route, matched if matched is not None else route


class MethodCheck:
    """Per request only a dict lookup: a path that is some route's literal path (no parameter) is
    answered 405 at once when no literal route takes the method; any other request goes through,
    and a 405 the router answers gets its ``Allow`` rewritten from every route that fits (the
    routes are matched then only). A full match on every request cost 115 us (52 routes,
    measured with timeit on this machine); the lookup costs about 1 us."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self._routes = routes
        self._table: list[tuple[Route, int]] | None = None
        self._literal: dict[str, set[str]] = {}

    def _ranked(self) -> list[tuple[Route, int]]:
        # Built on the first request: routes are added after the middleware is.
        if self._table is None:
            table = [
                (r, r.path.count("{"))
                for _, r in flat_routes(self._routes)
                if isinstance(r, Route) and r.methods
            ]
            for route, params in table:
                if params == 0:
                    self._literal.setdefault(route.path, set()).update(route.methods or ())
            self._table = table
        return self._table

    def allowed(self, scope: Scope) -> set[str]:
        """The methods of the most literal routes that fit the request's path (empty: none fits)."""
        fitting = [
            (route, params) for route, params in self._ranked() if route.matches(scope)[0] is not Match.NONE
        ]
        fewest = min((params for _, params in fitting), default=0)
        return {m for route, params in fitting if params == fewest for m in route.methods or ()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self._ranked()
        methods = self._literal.get(scope["path"])
        if methods is not None and scope["method"] not in methods:
            await self._refuse(scope, receive, send, methods)
            return

        async def send_with_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                allow = ", ".join(sorted(self.allowed(scope))).encode()
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                message = {**message, "headers": [*headers, (b"allow", allow)]}
            await send(message)

        await self.app(scope, receive, send_with_allow)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, methods: set[str]) -> None:
        allow = ", ".join(sorted(methods))
        response = error_response(
            405,
            "method_not_allowed",
            f"{scope['method']} is not allowed here; use {allow}.",
            headers={"Allow": allow},
        )
        await response(scope, receive, send)
