"""Python client for the Clarion notification API.

from clarion_client import Clarion

with Clarion(api_key, "http://127.0.0.1:8000") as clarion:
    accepted = clarion.send({"event_id": "order-123-shipped", "channel": "email", ...})
"""

from clarion_client.async_client import AsyncClarion
from clarion_client.client import Clarion
from clarion_client.errors import (
    AuthenticationError,
    BadRequestError,
    ClarionError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    ServerError,
    ServiceUnavailableError,
)
from clarion_client.models import Notification, Recipient

__all__ = [
    "AsyncClarion",
    "AuthenticationError",
    "BadRequestError",
    "Clarion",
    "ClarionError",
    "ConflictError",
    "InvalidRequestError",
    "NotFoundError",
    "Notification",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitedError",
    "Recipient",
    "ServerError",
    "ServiceUnavailableError",
]
