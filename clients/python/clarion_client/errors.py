"""The API's error body, ``{"error": {"code", "message", "details"}}``, raised as exceptions.

ClarionError                    any failure the API answered (status, code, message, details);
                                also invalid_link: a listing's next page named elsewhere
├── BadRequestError             400 (malformed_json)
├── AuthenticationError         401
├── PermissionDeniedError       403
├── NotFoundError               404
├── ConflictError               409 (event_id_conflict, not_cancellable, limit_reached...)
├── PayloadTooLargeError        413
├── InvalidRequestError         422 (validation_error, missing_template_variable...)
├── RateLimitedError            429 (retry_after: seconds), after the client's retries
├── ServiceUnavailableError     503, after the client's retries
└── ServerError                 any other 5xx
"""

from __future__ import annotations

from typing import Any

import httpx


class ClarionError(Exception):
    status: int = 0

    def __init__(
        self, status: int, code: str, message: str, details: Any = None, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.retry_after = retry_after


class BadRequestError(ClarionError): ...


class AuthenticationError(ClarionError): ...


class PermissionDeniedError(ClarionError): ...


class NotFoundError(ClarionError): ...


class ConflictError(ClarionError): ...


class PayloadTooLargeError(ClarionError): ...


class InvalidRequestError(ClarionError): ...


class RateLimitedError(ClarionError): ...


class ServiceUnavailableError(ClarionError): ...


class ServerError(ClarionError): ...


_BY_STATUS: dict[int, type[ClarionError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: InvalidRequestError,
    429: RateLimitedError,
    503: ServiceUnavailableError,
}


def error_from(response: httpx.Response, retry_after: float | None = None) -> ClarionError:
    """The exception for an error ``response`` (any body: a proxy's HTML page still raises)."""
    code, message, details = f"http_{response.status_code}", response.reason_phrase or "error", None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        code = str(error.get("code") or code)
        message = str(error.get("message") or message)
        details = error.get("details")
    kind = _BY_STATUS.get(response.status_code)
    if kind is None:
        kind = ServerError if response.status_code >= 500 else ClarionError
    return kind(response.status_code, code, message, details, retry_after)
