"""``405 Method Not Allowed`` with an ``Allow`` header naming every method of the path.

Starlette answers a method a route lacks with that one route's methods (``GET /v1/users/x`` and
``PUT /v1/users/x`` are two routes: a DELETE got ``Allow: GET``), and a path that also fits a
parameterised route goes there instead (``GET /v1/notifications/batch`` reached
``GET /v1/notifications/{id}`` and answered 422 for the id ``batch``). This middleware, around the
router, finds the routes whose path template fits, keeps the most literal ones (a fixed segment
beats a parameter) and answers 405 when none of them takes the method.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import fastapi.routing
from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

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
    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self._routes = routes
        self._table: list[tuple[Route, int]] | None = None

    def _ranked(self) -> list[tuple[Route, int]]:
        # Built on the first request: routes are added after the middleware is.
        if self._table is None:
            self._table = [
                (r, r.path.count("{"))
                for _, r in flat_routes(self._routes)
                if isinstance(r, Route) and r.methods
            ]
        return self._table

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        fitting: list[tuple[Route, int]] = []
        for route, params in self._ranked():
            match, _ = route.matches(scope)
            if match is not Match.NONE:
                fitting.append((route, params))
        if fitting:
            fewest = min(params for _, params in fitting)
            methods: set[str] = set()
            for route, params in fitting:
                if params == fewest:
                    methods |= route.methods or set()
            if scope["method"] not in methods:
                allow = ", ".join(sorted(methods))
                response = error_response(
                    405,
                    "method_not_allowed",
                    f"{scope['method']} is not allowed here; use {allow}.",
                    headers={"Allow": allow},
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
