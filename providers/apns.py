"""Apple Push Notification service: token (JWT) auth over HTTP/2.

APNs refuses HTTP/1.1. ``providers.h2client`` carries the pushes over ``connections`` HTTP/2
connections (an ``http://`` base URL speaks cleartext HTTP/2 with prior knowledge, for a local
fake). It replaced ``httpx``'s HTTP/2, which cost 1.3-1.9 ms of client CPU per push and capped a
worker near 270 pushes/s (see README, "Benchmarks"). ``apns2`` is not an option: its ``hyper``
dependency fails to import on Python 3.10+.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, ClassVar
from urllib.parse import quote

import jwt
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from providers.base import RenderedMessage, SendResult
from providers.errors import (
    PermanentProviderError,
    ProviderError,
    RecipientThrottled,
    TransientProviderError,
    overloaded,
    parse_retry_after,
    refusal,
)
from providers.h2client import H2Client, H2Error, H2Response, H2Timeout
from providers.settings import ApnsSettings
from schema.enums import Channel, Priority

MAX_PAYLOAD_BYTES = 4096
# Apple answers 429 TooManyProviderTokenUpdates when a team's JWT changes more often than this.
MIN_TOKEN_INTERVAL_S = 20 * 60

_INVALID_RECIPIENT = frozenset({"BadDeviceToken", "Unregistered", "ExpiredToken", "DeviceTokenNotForTopic"})
# "Too many requests were made consecutively to the same device token": that one device, not APNs.
_RECIPIENT_THROTTLED = "TooManyRequests"
_TRANSIENT = frozenset(
    {
        "Shutdown",
        "IdleTimeout",
        "TooManyProviderTokenUpdates",
        "InternalServerError",
        "ServiceUnavailable",
        "ExpiredProviderToken",
    }
)


class ApnsProvider:
    """Sends alert pushes to one app (topic) with one signing key over a few HTTP/2 connections, reused."""

    name: ClassVar[str] = "apns"
    channel: ClassVar[Channel] = Channel.push

    def __init__(self, settings: ApnsSettings, *, clock: Callable[[], float] = time.time) -> None:
        key = load_pem_private_key(settings.signing_key_pem(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != "secp256r1":
            raise ValueError("APNS signing key must be a P-256 EC key (.p8)")
        self._settings = settings
        self._key = key
        self._clock = clock
        self._client: H2Client | None = None
        self._token: str | None = None
        self._token_iat = 0
        self._topic = (settings.topic or "").encode()

    def _http(self) -> H2Client:
        if self._client is None:
            self._client = H2Client(
                self._settings.endpoint,
                connections=self._settings.connections,
                timeout_s=self._settings.timeout_s,
                ca_file=self._settings.ca_file,
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
        if response.status == 403 and _reason(response) == "ExpiredProviderToken":
            if self._refresh_after_expired(token):
                response = await self._post(message.to, payload, headers, self.provider_token())
        if response.status == 200:
            apns_id = response.headers.get(b"apns-id")
            return SendResult(
                provider=self.name,
                provider_message_id=apns_id.decode() if apns_id else str(message.notification_id),
                http_status=200,
            )
        raise self._classify(response)

    def _headers(self, message: RenderedMessage) -> list[tuple[bytes, bytes]]:
        """Every header but ``authorization``, as the bytes h2 sends (it validates none of them:
        ``h2connection._CONFIG``), so each value here must already be a valid header value."""
        high = message.priority in (Priority.high, Priority.critical)
        headers = [
            (b"apns-topic", self._topic),
            (b"apns-push-type", b"alert"),
            (b"apns-priority", b"10" if high else b"5"),
            (b"apns-id", str(message.notification_id).encode()),
            (b"content-type", b"application/json"),
        ]
        if message.collapse_id:
            if any(ord(c) < 0x20 or ord(c) == 0x7F for c in message.collapse_id):
                raise PermanentProviderError(
                    "the collapse id holds a line break or control character: it could add headers",
                    provider=self.name,
                    code="header_injection",
                )
            headers.append((b"apns-collapse-id", message.collapse_id.encode()))
        if message.expires_at is not None:
            headers.append((b"apns-expiration", str(max(0, int(message.expires_at.timestamp()))).encode()))
        return headers

    async def _post(
        self, device_token: str, payload: bytes, headers: list[tuple[bytes, bytes]], jwt_: str
    ) -> H2Response:
        try:
            return await self._http().post(
                f"/3/device/{quote(device_token, safe='')}",
                [*headers, (b"authorization", f"bearer {jwt_}".encode())],
                payload,
            )
        except H2Timeout as exc:
            raise TransientProviderError(
                f"APNs timed out: {exc!r}", provider=self.name, code="timeout"
            ) from exc
        except H2Error as exc:
            raise TransientProviderError(
                f"APNs connection failed: {exc!r}", provider=self.name, code="connection_error"
            ) from exc

    def _classify(self, response: H2Response) -> ProviderError:
        status = response.status
        reason = _reason(response) or f"http_{status}"
        text = f"APNs refused the push: {status} {reason}"
        retry_after_s = parse_retry_after(_text(response.headers.get(b"retry-after")))
        if reason == _RECIPIENT_THROTTLED:
            return RecipientThrottled(
                text, provider=self.name, code=reason, http_status=status, retry_after_s=retry_after_s
            )
        return refusal(
            text,
            provider=self.name,
            code=reason,
            http_status=status,
            invalid_recipient=reason in _INVALID_RECIPIENT,
            transient=reason in _TRANSIENT or overloaded(status),
            retry_after_s=retry_after_s,
        )

    async def aclose(self) -> None:
        """Close the HTTP/2 connections; a later ``send`` opens new ones."""
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


def _payload(message: RenderedMessage) -> bytes:
    alert: dict[str, str] = {"body": message.body}
    if message.subject:
        alert = {"title": message.subject, **alert}
    document: dict[str, Any] = {**message.data, "aps": {"alert": alert, "sound": "default"}}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def _reason(response: H2Response) -> str | None:
    try:
        reason = json.loads(response.body).get("reason")
    except (ValueError, AttributeError):
        return None
    return reason if isinstance(reason, str) else None


def _text(value: bytes | None) -> str | None:
    return value.decode("latin-1") if value is not None else None
