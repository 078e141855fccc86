"""Twilio Programmable Messaging: create a Message (REST API 2010-04-01) over aiohttp.

Not the ``twilio`` SDK: its ``TwilioRestException`` drops the response headers, so a 429's
``Retry-After`` would be lost, and its async client is one more pool to build inside the loop. The
endpoint is one form POST with Basic auth. The SDK's ``RequestValidator`` is what it does well: it
verifies the status callbacks this module asks for (``api.webhooks``).

``StatusCallback`` is ``status_callback_url``: set explicitly, or derived from Clarion's public URL
when ``status_callbacks`` is on (``TwilioSettings.with_status_callback``, applied by ``Settings``).
"""

from __future__ import annotations

import base64
import time
from typing import Any, ClassVar

from providers.base import RenderedMessage, SendResult
from providers.errors import (
    ProviderError,
    overloaded,
    parse_retry_after,
    refusal,
)
from providers.session import LazySession, json_object, transport_errors
from providers.settings import TwilioSettings
from schema.enums import Channel

STOP_REPLY = 21610  # the recipient replied STOP: Twilio refuses every later message to them
# Delivery errors a status callback reports after which this number will not take messages
# (docs/providers.md 3.3), and those of them that mean the user opted out of SMS.
DEAD_NUMBER_CODES = {
    "30004": "message blocked by the recipient or carrier",
    "30005": "unknown destination handset",
    "30006": "landline or unreachable carrier",
    str(STOP_REPLY): "recipient unsubscribed (replied STOP)",
}
OPT_OUT_CODES = frozenset({str(STOP_REPLY), "30004"})
# Invalid, unreachable, landline or opted-out (STOP) destination: stop sending to the number.
_INVALID_RECIPIENT = frozenset({21211, STOP_REPLY, 21612, 21614, 21635})
# Too many requests; the sender's queue would exceed 10 hours.
_TRANSIENT = frozenset({20429, 21611})
MAX_VALIDITY_PERIOD_S = 36000


class TwilioProvider:
    """Sends SMS from one Twilio account, via ``from_number`` or a Messaging Service."""

    name: ClassVar[str] = "twilio"
    channel: ClassVar[Channel] = Channel.sms

    def __init__(self, settings: TwilioSettings) -> None:
        if not settings.configured:
            raise ValueError("Twilio credentials are incomplete")
        if settings.status_callbacks and not settings.status_callback_url:
            # Settings derives the URL from public_url; a bare TwilioSettings has no public URL.
            raise ValueError("Twilio status_callbacks is on but no status_callback_url was resolved")
        self._settings = settings
        assert settings.account_sid is not None
        self._url = (
            f"{settings.base_url.rstrip('/')}/2010-04-01/Accounts/{settings.account_sid}/Messages.json"
        )
        if settings.api_key_sid is not None and settings.api_key_secret is not None:
            user, password = settings.api_key_sid, settings.api_key_secret.get_secret_value()
        else:
            assert settings.auth_token is not None
            user, password = settings.account_sid, settings.auth_token.get_secret_value()
        authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self._http = LazySession(
            timeout_s=settings.timeout_s,
            max_connections=settings.max_connections,
            headers={"Authorization": authorization, "Accept": "application/json"},
        )

    def _form(self, message: RenderedMessage) -> dict[str, str]:
        form = {"To": message.to, "Body": message.body}
        if self._settings.messaging_service_sid:
            form["MessagingServiceSid"] = self._settings.messaging_service_sid
        elif self._settings.from_number:
            # A channel address (whatsapp:+1...) is sent from the same number on that channel.
            channel, colon, _ = message.to.rpartition(":")
            form["From"] = f"{channel}{colon}{self._settings.from_number.rpartition(':')[2]}"
        if self._settings.status_callback_url:
            # The notification id rides in the (signed) URL, so a report that arrives before the
            # worker has recorded the message sid still finds its notification.
            url = self._settings.status_callback_url
            separator = "&" if "?" in url else "?"
            form["StatusCallback"] = f"{url}{separator}notification_id={message.notification_id}"
        if message.expires_at is not None:
            remaining_s = int(message.expires_at.timestamp() - time.time())
            if remaining_s < MAX_VALIDITY_PERIOD_S:
                form["ValidityPeriod"] = str(max(1, remaining_s))
        return form

    async def send(self, message: RenderedMessage) -> SendResult:
        """Create one outbound message; returns its ``SM...`` sid and segment count.

        Raises from ``providers.errors``; never retries (Twilio has no idempotency key, so a retry
        after a timeout may send twice: the worker's policy decides).
        """
        with transport_errors(provider=self.name, label="Twilio"):
            async with self._http.get().post(self._url, data=self._form(message)) as response:
                status, headers = response.status, response.headers
                document = json_object(await response.read())
        if status in (200, 201) and isinstance(document.get("sid"), str):
            return SendResult(
                provider=self.name,
                provider_message_id=document["sid"],
                segments=_segments(document.get("num_segments")),
                http_status=status,
            )
        raise self._classify(status, parse_retry_after(headers.get("Retry-After")), document)

    def _classify(self, status: int, retry_after_s: float | None, document: dict[str, Any]) -> ProviderError:
        raw_code = document.get("code")
        twilio_code = raw_code if isinstance(raw_code, int) else None
        code = str(twilio_code) if twilio_code is not None else f"http_{status}"
        text = f"Twilio refused the message: {status} {code}: {document.get('message', '')}"
        return refusal(
            text,
            provider=self.name,
            code=code,
            http_status=status,
            invalid_recipient=twilio_code in _INVALID_RECIPIENT,
            transient=twilio_code in _TRANSIENT or overloaded(status),
            retry_after_s=retry_after_s,
        )

    async def aclose(self) -> None:
        """Close the connection pool; a later ``send`` opens a new one."""
        await self._http.aclose()


def _segments(value: Any) -> int:
    try:
        return max(1, int(value))
    except (TypeError, ValueError):
        return 1
