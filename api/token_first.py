"""User-side requests whose signed token does not verify are refused here, past Starlette's router
and FastAPI's request machinery: the routes' own check, moved to the front.

The preference routes need no API key, so anyone can send them forged tokens in a loop, and the
refusal (a ``403 invalid_token``, no database) was already cheap; the request around it was not.
In 64 loops of forged tokens (``python -m bench.anonymous_flood``, 2026-11-29), py-spy put 3% of
the API's samples in the token check and most of the rest in routing (17%), FastAPI's request
handling and its exception path, and every request that waited its turn on the event loop behind
them (another tenant's send among them) waited for all of that.

:class:`TokenFirst` sits beside ``api.fast_route.FastRoute``, inside the user middlewares (size
limit, rate-limit headers, rejection counter still see the request), and answers a request for one
of ``routes`` whose ``token`` query parameter does not verify for the route's purpose, as the route
would: the error body, or the route's HTML page. A token that verifies goes on to the route, which
checks it again (microseconds) and then takes its turn (``api.preference_gate``). Being first, the
refusal also comes before the route's other checks: a forged token with a malformed body, or one
over 2,048 characters, is this 403 where the route alone answered 400 ``malformed_json`` or 422
``validation_error`` (JSON, on a page too). Deliberately: passing them on would give a flood the
router and FastAPI's request handling back.

Measured (A/B/B/A against f09e5a3, 64 loops, the other tenant's accept p99, alone 9-21 ms): forged
unsubscribe tokens 216-317 ms before, 56-72 ms after; forged preference tokens 146-376 ms before,
51-80 ms after; each refusal is about a third of the API's CPU it was (3,600-4,400 answered a
second at one core before, 9,400-13,700 after). What is left is uvicorn's own parsing, the user
middlewares and the socket writes: a flood of requests as cheap as a refusal can get still costs
the event loop, and bounding it per client address belongs in front of the API.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from urllib.parse import parse_qsl

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import ApiError, error_response
from api.preference_links import verified_claims
from clarion.settings import Settings


@dataclass(frozen=True, slots=True)
class UserSideRoute:
    purpose: str  # what the route's token must be for
    page: bool  # refused as an HTML page (a person opened a link) rather than the error body


@dataclass(eq=False)
class TokenFirst:
    """Refuses ``routes`` (``(method, path)``) whose token does not verify; the rest goes to ``app``."""

    app: ASGIApp
    _: KW_ONLY
    settings: Settings
    routes: Mapping[tuple[str, str], UserSideRoute]
    page: Callable[[ApiError], Response]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get((scope.get("method", ""), scope["path"])) if scope["type"] == "http" else None
        if route is not None:
            # As Starlette reads it: the last ``token`` wins.
            query = parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)
            token = next((value for name, value in reversed(query) if name == "token"), None)
            try:
                verified_claims(settings=self.settings, token=token, purposes={route.purpose})
            except ApiError as exc:
                refusal = self.page(exc) if route.page else error_response(exc.status, exc.code, exc.message)
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)
