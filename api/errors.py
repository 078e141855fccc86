"""One error shape for every failure: ``{"error": {"code", "message", "details"}}``, whose texts
quote the caller no further than `api.refusal_text` allows."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import asyncpg
from asyncpg.exceptions import InternalClientError
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.refusal_text import MAX_LISTED_ERRORS, MAX_QUOTE_CHARS, bounded, excerpt
from clarion.printable_ids import unprintable

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error the caller can act on: HTTP status, machine-readable code, human message."""

    def __init__(
        self, status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers


def db_unavailable() -> ApiError:
    """PostgreSQL cannot take the request now (down, restarting, a lock not got): a 503 to retry."""
    return ApiError(
        503,
        "database_unavailable",
        "The notification log is unavailable; retry shortly.",
        headers={"Retry-After": "2"},
    )


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    """The error shape, its texts bounded and inert (`api.refusal_text`): messages quote the caller."""
    return {"error": {"code": code, "message": bounded(message), "details": bounded(details)}}


def error_response(
    status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "rate_limited",
}


def _field(loc: tuple[Any, ...]) -> str:
    """A bad field's path; a part may be a key the caller chose, of any length."""
    parts = [excerpt(str(p), MAX_QUOTE_CHARS) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


def validation_error(errors: Sequence[Any]) -> ApiError:
    """The 422 for pydantic errors: the first ``MAX_LISTED_ERRORS`` bad fields with their messages
    (the first in the message), then how many more. Never pydantic's ``input`` or ``ctx``: the
    caller's own values (`api.refusal_text`)."""
    details: list[dict[str, Any]] = [
        {"field": _field(tuple(e.get("loc", ()))), "message": str(e.get("msg")), "type": e.get("type")}
        for e in errors[:MAX_LISTED_ERRORS]
    ]
    if len(errors) > MAX_LISTED_ERRORS:
        more = f"{len(errors) - MAX_LISTED_ERRORS:,} more errors not listed"
        details.append({"field": "body", "message": more, "type": "too_many_errors"})
    first = details[0] if details else {"field": "body", "message": "invalid"}
    return ApiError(422, "validation_error", f"{first['field']}: {first['message']}", details)


def unprintable_id(field: str, value: str) -> ApiError | None:
    """The 422 for a new identifier ``value`` of ``field`` outside ``clarion.printable_ids``, or
    None when it is a printable id."""
    problem = unprintable(value)
    if problem is None:
        return None
    detail = {"field": field, "message": problem, "type": "unprintable_id"}
    return ApiError(422, "validation_error", f"{field}: {problem}", [detail])


def is_db_unavailable(exc: BaseException) -> bool:
    if isinstance(exc, (OperationalError, InterfaceError, ConnectionError, OSError)):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    name = type(getattr(exc, "orig", exc)).__name__
    if name in {
        "CannotConnectNowError",
        "ConnectionDoesNotExistError",
        "InterfaceError",
        "TooManyConnectionsError",
        "InternalClientError",  # asyncpg, on a connection left mid-operation by a server restart
    }:
        return True
    # SQLSTATE 08 (connection exception) and 57P (server shutting down, restarting) anywhere in the chain.
    cause: BaseException | None = exc
    seen: set[int] = set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
        if isinstance(state, str) and (state.startswith("08") or state.startswith("57P")):
            return True
        cause = cause.__cause__
    return False


def is_unstorable_value(exc: BaseException | None) -> bool:
    """PostgreSQL refused a value the caller sent (SQLSTATE class 22: a NUL character, a number
    out of range...), or the driver could not encode it: the request's fault, not the server's."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
        if isinstance(state, str) and state.startswith("22"):
            return True
        if type(exc).__name__ == "DataError" and type(exc).__module__.startswith("asyncpg"):
            return True
        exc = exc.__cause__ or getattr(exc, "orig", None)
    return False


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(400, "malformed_json", "The request body is not valid JSON.")
        error = validation_error(errors)
        return error_response(422, error.code, error.message, error.details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail), None, dict(exc.headers or {}) or None)

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        if is_unstorable_value(exc):
            log.info("refused a value the database cannot store: %s", type(exc).__name__)
            return error_response(
                422,
                "invalid_value",
                "A value in the request cannot be stored (a NUL character, or a number out of range).",
            )
        if is_db_unavailable(exc):
            log.warning("database unavailable: %s", type(exc).__name__)
            return await _api_error(request, db_unavailable())
        # The class and the route only: an exception's text and a traceback's frames can quote the
        # request's values (a body, a rendered template), so those need DEBUG.
        log.error(
            "unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path,
            exc_info=exc if log.isEnabledFor(logging.DEBUG) else None,
        )  # fmt: skip
        return error_response(500, "internal_error", "Internal error.")

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        """The client left before its body arrived (a load generator stopping, a mobile network):
        nothing was accepted, nobody reads the answer. Not an error of ours: a debug line."""
        log.debug("client left during %s %s", request.method, request.url.path)
        return Response(status_code=499)

    # Database and network failures are answered here, not by the catch-all above: Starlette
    # re-raises what reaches that one to the server, and uvicorn then logs a traceback and closes
    # the client's connection after every 503 of a database outage.
    for kind in (DBAPIError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError, InternalClientError):
        app.add_exception_handler(kind, _unhandled)


MAX_HEADER_BYTES = 16 * 1024  # nginx's default large_client_header_buffers is 4 x 8 KiB


class BodySizeLimit:
    """Refuses request headers over ``MAX_HEADER_BYTES`` in all (431) and bodies over ``max_bytes``
    (413) before anything reads or parses them (an 8 MB Authorization header was looked up and
    cached before)."""

    def __init__(self, app: ASGIApp, max_bytes: int, per_path: dict[str, int] | None = None) -> None:
        self.app = app
        self.default_max_bytes = max_bytes
        self.per_path = per_path or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw_headers = scope.get("headers") or []
        if sum(len(k) + len(v) for k, v in raw_headers) > MAX_HEADER_BYTES:
            response = error_response(
                431, "headers_too_large", f"The request headers are larger than {MAX_HEADER_BYTES} bytes."
            )
            await response(scope, receive, send)
            return
        max_bytes = self.per_path.get(scope.get("path", ""), self.default_max_bytes)
        headers = dict(raw_headers)
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            await self._reject(scope, receive, send, max_bytes)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise _TooLarge(max_bytes)
            return message

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._reject(scope, receive, send, max_bytes)

    async def _reject(self, scope: Scope, receive: Receive, send: Send, max_bytes: int) -> None:
        response = error_response(
            413, "payload_too_large", f"The request body is larger than {max_bytes} bytes."
        )
        await response(scope, receive, send)


class _TooLarge(ApiError):
    """Raised from ``receive`` past the limit; a handler reading the body itself answers 413 with it."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, "payload_too_large", f"The request body is larger than {max_bytes} bytes.")
