"""The one error hierarchy every provider raises.

    ProviderError
     ├── TransientProviderError      timeouts, connection errors, 5xx, 429 (carries retry_after_s)
     │    ├── RecipientThrottled     the provider works, but takes no more for this one recipient now
     │    └── QuotaExceeded          a quota ran out that may be one recipient's or the account's
     └── PermanentProviderError      bad request, auth/config errors: retrying unchanged cannot help
          └── InvalidRecipient       the address or device token is invalid: stop sending to it

Providers classify once, here, and never retry, sleep or swallow: the worker's retry policy decides
what happens next. The one exception is credential refresh: APNS re-mints its JWT after
``ExpiredProviderToken`` and FCM refreshes its OAuth token after ``401 UNAUTHENTICATED``, and each
resends once; that is authentication, not a retry policy. Nor is ``providers.h2client`` sending
again an HTTP/2 stream the server declared unprocessed (GOAWAY, REFUSED_STREAM): it never reached APNs.

``code`` per provider: APNS the ``reason`` string (``Unregistered``), FCM the ``errorCode`` or
canonical ``status`` (``UNREGISTERED``), Twilio the numeric code as a string (``21211``), SendGrid
``http_<status>``; transport failures use ``timeout`` or ``connection_error``.
"""

from __future__ import annotations

import time
from datetime import UTC
from email.utils import parsedate_to_datetime


class ProviderError(Exception):
    """A provider call did not deliver.

    ``code`` is the provider's own error code (``Unregistered``, ``21211``, ``UNREGISTERED``,
    ``http_503``...), ``http_status`` the HTTP status when there was a response.
    """

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        code: str,
        http_status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.provider = provider
        self.code = code
        self.http_status = http_status

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(provider={self.provider!r}, code={self.code!r}, message={self.message!r})"
        )


class TransientProviderError(ProviderError):
    """Worth retrying later; ``retry_after_s`` is the provider's own hint when it gave one."""

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        code: str,
        http_status: int | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message, provider=provider, code=code, http_status=http_status)
        self.retry_after_s = retry_after_s


class RecipientThrottled(TransientProviderError):
    """The provider is working and refuses more for this one recipient for now (APNs ``429
    TooManyRequests``: too many pushes to the same device token). Retried later like any transient
    error, but it says nothing about the provider's health: the tenant that sends too much to one of
    its devices must not open the breaker or slow the pacing every tenant's sends share."""


class QuotaExceeded(TransientProviderError):
    """A quota ran out, and the provider does not say whose: FCM answers ``429 QUOTA_EXCEEDED`` alike
    for the project's message rate, one device's (240 a minute) and one topic's. Retried later like
    any transient error. The worker charges it to the tenant whose send it was, on that tenant's own
    breaker for the provider (``workers.breaker``), and it slows no pacing: one tenant flooding one
    of its devices must not stop every tenant's pushes. Once several tenants are refused so within
    the breaker's window, each on a device of its own, it is taken for the provider's quota: it
    counts on the provider's breaker and slows the pacing (``Breakers.widespread``). A refusal that
    names the project's quota is no ``QuotaExceeded`` but a plain ``TransientProviderError``
    (``providers.fcm._projects_quota``)."""


class PermanentProviderError(ProviderError):
    """Retrying the same request cannot succeed (malformed request, rejected credentials, config)."""


class InvalidRecipient(PermanentProviderError):
    """The recipient address or device token is invalid; the device is deactivated on this error."""


def overloaded(http_status: int) -> bool:
    """``429`` or any ``5xx``: the provider is busy or failing, not refusing this request."""
    return http_status == 429 or http_status >= 500


def refusal(
    text: str,
    *,
    provider: str,
    code: str,
    http_status: int,
    invalid_recipient: bool,
    transient: bool,
    retry_after_s: float | None = None,
) -> ProviderError:
    """The error for a provider that answered without delivering, as the provider's own classifier
    judged its answer: the recipient invalid, else worth retrying (``transient``), else permanent."""
    if invalid_recipient:
        return InvalidRecipient(text, provider=provider, code=code, http_status=http_status)
    if transient:
        return TransientProviderError(
            text, provider=provider, code=code, http_status=http_status, retry_after_s=retry_after_s
        )
    return PermanentProviderError(text, provider=provider, code=code, http_status=http_status)


def parse_retry_after(value: str | None, *, now_s: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date), ``None`` if absent/bad.

    Never negative: a date in the past means "now" (0.0).
    """
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    now = now_s if now_s is not None else time.time()
    return max(0.0, when.timestamp() - now)
