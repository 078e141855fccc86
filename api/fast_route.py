"""The hot route served past Starlette's router and FastAPI's request machinery.

``POST /v1/notifications`` is nearly all of an API's traffic. Matching it against every route,
and FastAPI's per-request wrapper, exception-middleware and exit-stack layers, cost about a
quarter of the API's CPU per send (py-spy under ``bench.e2e``), more than validating the body.
:class:`FastRoute` sits inside the user middlewares (size limit, rate-limit headers, rejection
counter: they all still see the request) and calls the route's own endpoint directly. The route
stays registered, so the OpenAPI document and every other method on the path are unchanged.

Errors are answered by the app's own exception handlers, looked up as Starlette looks them up; what
has none (a bug) propagates to Starlette's server-error middleware, as it would from the router.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

Endpoint = Callable[[Request], Awaitable[Response]]
Handler = Callable[[Request, Any], Any]  # a Response, or an awaitable of one


def is_async_callable(obj: object) -> bool:
    """Whether calling ``obj`` returns an awaitable: a coroutine function, a ``functools.partial``
    of one, or an object whose ``__call__`` is one. Starlette asks the same of an exception handler
    (its private ``starlette._utils``, which may change without notice, so not imported)."""
    while isinstance(obj, functools.partial):
        obj = obj.func
    return inspect.iscoroutinefunction(obj) or (callable(obj) and inspect.iscoroutinefunction(obj.__call__))


@dataclass(eq=False)
class FastRoute:
    """Serves ``method path`` with ``endpoint(request)``; everything else goes on to ``app``."""

    app: ASGIApp
    _: KW_ONLY
    method: str
    path: str
    endpoint: Endpoint
    # The app's handlers by exception type; the catch-all for ``Exception`` belongs to
    # Starlette's server-error middleware, which also re-raises to the server, so it is left there.
    handlers: Mapping[Any, Handler]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != self.method:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await self.endpoint(request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            if is_async_callable(handler):
                response = await handler(request, exc)
            else:
                response = await run_in_threadpool(handler, request, exc)
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> Handler | None:
        for kind in type(exc).__mro__:
            if kind is Exception:
                return None
            if kind in self.handlers:
                return self.handlers[kind]
        return None
