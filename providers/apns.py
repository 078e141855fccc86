"""Apple Push Notification service: token (JWT) auth over HTTP/2.

``httpx.AsyncClient(http2=True, http1=False)``: APNs refuses HTTP/1.1, and with ``http1=False`` an
``http://`` base URL speaks cleartext HTTP/2 with prior knowledge (useful against a local fake).
``apns2`` is not an option: its ``hyper`` dependency fails to import on Python 3.10+.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable
from typing import Any, ClassVar

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from providers.base import RenderedMessage, SendResult
from providers.errors import (
    InvalidRecipient,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
    parse_retry_after,
)
from providers.settings import ApnsSettings
from schema.enums import Channel, Priority

MAX_PAYLOAD_BYTES = 4096
# Apple answers 429 TooManyProviderTokenUpdates when a team's JWT changes more often than this.
MIN_TOKEN_INTERVAL_S = 20 * 60

_INVALID_RECIPIENT = frozenset({"BadDeviceToken", "Unregistered", "ExpiredToken", "DeviceTokenNotForTopic"})
_TRANSIENT = frozenset(
    {
        "Shutdown",
        "IdleTimeout",
        "TooManyRequests",
        "TooManyProviderTokenUpdates",
        "InternalServerError",
        "ServiceUnavailable",
        "ExpiredProviderToken",
    }
)


class ApnsProvider:
    """Sends alert pushes to one app (topic) with one signing key; one HTTP/2 connection, reused."""

    name: ClassVar[str] = "apns"
    channel: ClassVar[Channel] = Channel.push

    def __init__(self, settings: ApnsSettings, *, clock: Callable[[], float] = time.time) -> None:
        key = load_pem_private_key(settings.signing_key_pem(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
            raise ValueError("APNS signing key must be a P-256 EC key (.p8)")
        self._settings = settings
        self._key = key
        self._clock = clock
        self._client: httpx.AsyncClient | None = None
        self._token: str | None = None
        self._token_iat = 0

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            verify: ssl.SSLContext | bool = True
            if self._settings.ca_file is not None:
                verify = ssl.create_default_context(cafile=str(self._settings.ca_file))
            self._client = httpx.AsyncClient(
                http1=False,
                http2=True,
                verify=verify,
                timeout=httpx.Timeout(self._settings.timeout_s),
                base_url=self._settings.endpoint,
            )
        return self._client

    def provider_token(self) -> str:
        """The cached provider JWT, re-minted once it is ``token_refresh_s`` old."""
        now = int(self._clock())
        if self._token is None or now - self._token_iat >= self._settings.token_refresh_s:
            self._mint(now)
        assert self._token is not None
        return self._token

    def _mint(self, now: int) -> None:
        self._token = jwt.encode(
            {"iss": self._settings.team_id, "iat": now},
            self._key,
            algorithm="ES256",
            headers={"kid": self._settings.key_id},
        )
        self._token_iat = now

    def _refresh_after_expired(self, rejected: str) -> bool:
        """Re-mint after ``ExpiredProviderToken`` unless that would break Apple's 20-minute floor."""
        if self._token != rejected:
            return True  # another send already replaced it
        now = int(self._clock())
        if now - self._token_iat < MIN_TOKEN_INTERVAL_S:
            return False
        self._mint(now)
        return True

    async def send(self, message: RenderedMessage) -> SendResult:
        """Deliver one alert push; returns APNs' ``apns-id``. Raises from ``providers.errors``.

        Re-sends once, with a fresh JWT, only after ``ExpiredProviderToken``.
        """
        payload = _payload(message)
        if len(payload) > MAX_PAYLOAD_BYTES:
            raise PermanentProviderError(
                f"payload is {len(payload)} bytes, APNs allows {MAX_PAYLOAD_BYTES}",
                provider=self.name,
                code="PayloadTooLarge",
            )
        headers = self._headers(message)
        token = self.provider_token()
        response = await self._post(message.to, payload, headers, token)
        if response.status_code == 403 and _reason(response) == "ExpiredProviderToken":
            if self._refresh_after_expired(token):
                response = await self._post(message.to, payload, headers, self.provider_token())
        if response.status_code == 200:
            return SendResult(
                provider=self.name,
                provider_message_id=response.headers.get("apns-id", headers["apns-id"]),
                http_status=200,
            )
        raise self._classify(response)

    def _headers(self, message: RenderedMessage) -> dict[str, str]:
        headers = {
            "apns-topic": self._settings.topic or "",
            "apns-push-type": "alert",
            "apns-priority": "10" if message.priority in (Priority.high, Priority.critical) else "5",
            "apns-id": str(message.notification_id),
            "content-type": "application/json",
        }
        if message.collapse_id:
            headers["apns-collapse-id"] = message.collapse_id
        if message.expires_at is not None:
            headers["apns-expiration"] = str(max(0, int(message.expires_at.timestamp())))
        return headers

    async def _post(
        self, device_token: str, payload: bytes, headers: dict[str, str], jwt_: str
    ) -> httpx.Response:
        try:
            return await self._http().post(
                f"/3/device/{device_token}",
                content=payload,
                headers={**headers, "authorization": f"bearer {jwt_}"},
            )
        except httpx.TimeoutException as exc:
            raise TransientProviderError(
                f"APNs timed out: {exc!r}", provider=self.name, code="timeout"
            ) from exc
        except httpx.TransportError as exc:
            raise TransientProviderError(
                f"APNs connection failed: {exc!r}", provider=self.name, code="connection_error"
            ) from exc

    def _classify(self, response: httpx.Response) -> ProviderError:
        status = response.status_code
        reason = _reason(response) or f"http_{status}"
        text = f"APNs refused the push: {status} {reason}"
        if reason in _INVALID_RECIPIENT:
            return InvalidRecipient(text, provider=self.name, code=reason, http_status=status)
        if reason in _TRANSIENT or status == 429 or status >= 500:
            return TransientProviderError(
                text,
                provider=self.name,
                code=reason,
                http_status=status,
                retry_after_s=parse_retry_after(response.headers.get("retry-after")),
            )
        return PermanentProviderError(text, provider=self.name, code=reason, http_status=status)

    async def aclose(self) -> None:
        """Close the HTTP/2 connection; a later ``send`` opens a new one."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


def _payload(message: RenderedMessage) -> bytes:
    alert: dict[str, str] = {"body": message.body}
    if message.subject:
        alert = {"title": message.subject, **alert}
    document: dict[str, Any] = {**message.data, "aps": {"alert": alert, "sound": "default"}}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def _reason(response: httpx.Response) -> str | None:
    try:
        reason = response.json().get("reason")
    except (ValueError, AttributeError):
        return None
    return reason if isinstance(reason, str) else None
