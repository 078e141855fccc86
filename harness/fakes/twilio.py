"""A local Twilio Messages API: ``POST /2010-04-01/Accounts/{sid}/Messages.json`` (form body, Basic auth).

Answers 201 with the full Message resource (``SM`` + 32 hex sid, string ``num_segments``, RFC 2822
dates) or Twilio's ``{"code", "message", "more_info", "status"}`` error JSON. After a create that
carries ``StatusCallback``, POSTs the status callbacks Twilio would (``sent``, then ``delivered``, or
``undelivered``/``failed`` with ``ErrorCode`` per ``fail_number_async``), form-encoded and signed with
``X-Twilio-Signature`` (docs/providers.md 3.4, 3.5) using the fake's auth token.
"""

from __future__ import annotations

import asyncio
import base64
import math
import re
import secrets
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

from aiohttp import web
from twilio.request_validator import RequestValidator

from harness.fakes.base import AiohttpFake, json_response, run_cli
from harness.fakes.reports import Reports


@dataclass
class Callback:
    """One status callback the fake POSTed, and how the receiver answered."""

    url: str
    params: dict[str, str]
    signature: str
    status: int = 0


_E164 = re.compile(r"^\+[1-9]\d{6,14}$")
_CONTENT_SID = re.compile(r"^HX[0-9a-f]{32}$")
_GSM7 = set(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§"
    "¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
_GSM7_EXTENDED = set("^{}\\[]~|€\f")
_MESSAGES = {
    20003: "Authenticate",
    20404: "The requested resource was not found",
    20429: "Too Many Requests",
    21211: "The 'To' number is not a valid phone number.",
    21602: "Message body is required.",
    21603: "A 'From' phone number is required.",
    21604: "A 'To' phone number is required.",
    21606: "The 'From' phone number provided is not a valid message-capable Twilio phone number.",
    21608: "The number is unverified. Trial accounts may only send messages to verified numbers.",
    21610: "Attempt to send to unsubscribed recipient",
    21612: "The 'To' phone number is not currently reachable using the 'From' phone number.",
    21614: "'To' number is not a valid mobile number",
    21910: "Invalid From and To pair. From and To should be of the same channel",
    21656: "The ContentSid is Invalid.",
    21617: "The concatenated message body exceeds the 1600 character limit.",
    21635: "'To' number cannot be a landline.",
}


def num_segments(body: str) -> int:
    """GSM-7: 160 per single message, 153 per part; otherwise UCS-2: 70 / 67 (astral chars count 2)."""
    if all(c in _GSM7 or c in _GSM7_EXTENDED for c in body):
        length = sum(2 if c in _GSM7_EXTENDED else 1 for c in body)
        return 1 if length <= 160 else math.ceil(length / 153)
    length = sum(2 if ord(c) > 0xFFFF else 1 for c in body)
    return 1 if length <= 70 else math.ceil(length / 67)


class FakeTwilio(AiohttpFake):
    """One account; ``fail_number(to, code)`` makes sends to ``to`` fail with a Twilio error code."""

    def __init__(self, *, port: int = 0) -> None:
        super().__init__(port=port)
        self.account_sid = "AC" + secrets.token_hex(16)
        self.auth_token = secrets.token_hex(16)
        self.api_key_sid = "SK" + secrets.token_hex(16)
        self.api_key_secret = secrets.token_urlsafe(24)
        self.number_errors: dict[str, int] = {}
        self.async_errors: dict[str, tuple[int, str]] = {}
        self.callback_delay_s = 0.3
        self.callbacks_reversed = False
        self.callbacks: list[Callback] = []
        # Twilio's Messages API sends no Retry-After on 429 (docs/providers.md 7.3). True adds
        # one, for pipeline tests of Retry-After handling only, never for Twilio's behaviour.
        self.retry_after_hint = False
        self._reports = Reports()

    def fail_number_async(self, number: str, code: int, *, status: str = "undelivered") -> None:
        """Creates to ``number`` succeed, then its final status callback is ``status`` (``undelivered``
        or ``failed``) with ``ErrorCode`` = ``code`` (e.g. 30003 unreachable, 21610 STOP)."""
        self.async_errors[number] = (code, status)

    def sign(self, url: str, params: dict[str, str]) -> str:
        """``X-Twilio-Signature`` for a form POST of ``params`` to ``url`` (docs/providers.md 3.5)."""
        return str(RequestValidator(self.auth_token).compute_signature(url, params))

    async def stop(self) -> None:
        await self._reports.aclose()
        await super().stop()

    def _schedule_callbacks(self, form: dict[str, str], resource: dict[str, Any]) -> None:
        url = form.get("StatusCallback")
        if not url:
            return
        common = {
            "AccountSid": self.account_sid,
            "ApiVersion": "2010-04-01",
            "MessageSid": resource["sid"],
            "SmsSid": resource["sid"],
            "From": form.get("From", "+15005550006"),
            "To": form["To"],
        }
        if form.get("MessagingServiceSid"):
            common["MessagingServiceSid"] = form["MessagingServiceSid"]
        final: dict[str, str] = {"MessageStatus": "delivered"}
        if form["To"] in self.async_errors:
            code, status = self.async_errors[form["To"]]
            final = {"MessageStatus": status, "ErrorCode": str(code)}
        steps = [{"MessageStatus": "sent"}, final]
        if self.callbacks_reversed:
            steps.reverse()
        self._reports.schedule(self._post_callbacks(url, [{**common, **step} for step in steps]))

    async def _post_callbacks(self, url: str, batches: list[dict[str, str]]) -> None:
        for params in batches:
            await asyncio.sleep(self.callback_delay_s)
            params["SmsStatus"] = params["MessageStatus"]
            callback = Callback(url, params, self.sign(url, params))
            self.callbacks.append(callback)
            callback.status = await self._reports.post(
                url, data=params, headers={"X-Twilio-Signature": callback.signature}
            )

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "account_sid": self.account_sid, "auth_token": self.auth_token}

    def fail_number(self, number: str, code: int) -> None:
        """Sends to ``number`` get Twilio error ``code`` (HTTP 400)."""
        self.number_errors[number] = code

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/2010-04-01/Accounts/{sid}/Messages.json", self._create)]

    def _error(self, status: int, code: int, **headers: str) -> web.Response:
        document = {
            "code": code,
            "message": _MESSAGES.get(code, "Error"),
            "more_info": f"https://www.twilio.com/docs/errors/{code}",
            "status": status,
        }
        return json_response(status, document, headers)

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Basic":
            return False
        user, _, password = base64.b64decode(encoded).decode().partition(":")
        return (user, password) in {
            (self.account_sid, self.auth_token),
            (self.api_key_sid, self.api_key_secret),
        }

    async def _create(self, request: web.Request) -> web.StreamResponse:
        recorded = await self.capture(request)
        if not self._authorized(request):
            return self._error(401, 20003)
        if request.match_info["sid"] != self.account_sid:
            return self._error(404, 20404)
        forced = self.next_forced()
        if forced is not None and forced.kind == "rate_limit":
            # Twilio documents no Retry-After for the Messages API; only an explicit opt-in sends one.
            hint = {"Retry-After": str(int(forced.retry_after_s or 1))} if self.retry_after_hint else {}
            return self._error(429, 20429, **hint)
        if forced is not None and forced.kind == "server_error":
            extra = {"Retry-After": str(int(forced.retry_after_s))} if forced.retry_after_s else {}
            return self._error(forced.status, 20500, **extra)
        if forced is not None and forced.kind == "timeout":
            await asyncio.sleep(forced.delay_s)
        form: dict[str, str] = recorded.body if isinstance(recorded.body, dict) else {}
        code = _validate(form)
        if code is None:
            code = self.number_errors.get(form["To"])
        if code is not None:
            return self._error(400, code)
        resource = self._resource(form)
        self._schedule_callbacks(form, resource)
        return json_response(201, resource)

    def _resource(self, form: dict[str, str]) -> dict[str, Any]:
        sid = "SM" + secrets.token_hex(16)
        now = formatdate(usegmt=True).replace("GMT", "+0000")
        service = form.get("MessagingServiceSid")
        uri = f"/2010-04-01/Accounts/{self.account_sid}/Messages/{sid}"
        return {
            "sid": sid,
            "account_sid": self.account_sid,
            "api_version": "2010-04-01",
            "status": "accepted" if service else "queued",
            "to": form["To"],
            "from": None if service else form.get("From"),
            "messaging_service_sid": service,
            "body": form.get("Body", ""),
            "num_segments": str(num_segments(form.get("Body", "")) if form.get("Body") else 1),
            "num_media": "0",
            "direction": "outbound-api",
            "error_code": None,
            "error_message": None,
            "price": None,
            "price_unit": "USD",
            "date_created": now,
            "date_updated": now,
            "date_sent": None,
            "uri": f"{uri}.json",
            "subresource_uris": {"media": f"{uri}/Media.json", "feedback": f"{uri}/Feedback.json"},
        }


def _validate(form: dict[str, str]) -> int | None:
    """The Twilio error code a create with this form gets, or None."""
    if not form.get("To"):
        return 21604
    channel, _, address = form["To"].rpartition(":")
    if not (_E164.match(address) if channel in ("", "whatsapp", "rcs") else channel == "messenger"):
        return 21211
    if not form.get("From") and not form.get("MessagingServiceSid"):
        return 21603
    if form.get("From") and form["From"].rpartition(":")[0] != channel:
        return 21910  # Invalid From and To pair: both on the same channel
    if form.get("ContentSid") and not _CONTENT_SID.match(form["ContentSid"]):
        return 21656
    if not (form.get("Body") or form.get("MediaUrl") or form.get("ContentSid")):
        return 21602
    if len(form.get("Body", "")) > 1600:
        return 21617
    validity = form.get("ValidityPeriod")
    if validity is not None and not (validity.isdigit() and 1 <= int(validity) <= 36000):
        return 21624
    return None


if __name__ == "__main__":
    run_cli(FakeTwilio, "Local Twilio Messages API fake")
