"""SendGrid v3 Mail Send: the body built by the ``sendgrid`` package's mail helpers, POSTed over aiohttp.

The package's own client is synchronous (urllib, a new connection per call), so only its helpers
are used; the transport is a pooled aiohttp session.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from sendgrid.helpers.mail import (
    Category,
    CustomArg,
    Email,
    From,
    Header,
    HtmlContent,
    Mail,
    MailSettings,
    PlainTextContent,
    SandBoxMode,
    Subject,
    To,
)
from sendgrid.helpers.mail.exceptions import ApiKeyIncludedException

from providers.base import RenderedMessage, SendResult
from providers.errors import (
    PermanentProviderError,
    ProviderError,
    overloaded,
    parse_retry_after,
    refusal,
)
from providers.headers import check_header_value
from providers.session import LazySession, json_object, transport_errors
from providers.settings import SendGridSettings
from schema.enums import Channel

_E = TypeVar("_E", bound=Email)

# An error on personalizations[i].to[j](.email) blames the recipient address, not our request.
_RECIPIENT_FIELD = re.compile(r"^personalizations(\.\d+|\[\d+\])?\.to(\.|\[|$)")


class SendGridProvider:
    """Sends email from one verified sender with one API key."""

    name: ClassVar[str] = "sendgrid"
    channel: ClassVar[Channel] = Channel.email

    def __init__(self, settings: SendGridSettings) -> None:
        if settings.api_key is None or settings.from_email is None:
            raise ValueError("SendGrid api_key and from_email are required")
        self._settings = settings
        self._from_email: str = settings.from_email
        self._url = f"{settings.base_url.rstrip('/')}/v3/mail/send"
        headers = {
            "Authorization": f"Bearer {settings.api_key.get_secret_value()}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        self._http = LazySession(
            timeout_s=settings.timeout_s, max_connections=settings.max_connections, headers=headers
        )

    def body(self, message: RenderedMessage) -> dict[str, Any]:
        """The Mail Send JSON for one message, built with the SDK's mail helpers (which put
        text/plain first, then text/html, as SendGrid requires). The notification id and tenant
        travel as ``custom_args``, so every Event Webhook event names its notification."""
        if not message.subject:
            raise PermanentProviderError(
                "an email needs a subject", provider=self.name, code="missing_subject"
            )
        try:
            mail = Mail(
                from_email=_address(
                    From,
                    self._from_email,
                    check_header_value(self._settings.from_name or "", provider=self.name, field="from name")
                    or None,
                ),
                to_emails=_address(To, message.to),
                subject=Subject(check_header_value(message.subject, provider=self.name, field="subject")),
                plain_text_content=PlainTextContent(message.body),
                html_content=HtmlContent(message.html) if message.html else None,
            )
        except ApiKeyIncludedException as exc:
            # The SDK refuses content that starts like a SendGrid API key: never mail a secret.
            raise PermanentProviderError(
                "the email content looks like a SendGrid API key",
                provider=self.name,
                code="api_key_in_content",
            ) from exc
        mail.category = Category(message.category)
        mail.custom_arg = CustomArg("notification_id", str(message.notification_id))
        mail.custom_arg = CustomArg("tenant_id", message.tenant_id)
        if message.unsubscribe_url:
            mail.header = Header("List-Unsubscribe", f"<{message.unsubscribe_url}>")
            mail.header = Header("List-Unsubscribe-Post", "List-Unsubscribe=One-Click")
        if self._settings.sandbox_mode:
            mail.mail_settings = MailSettings(sandbox_mode=SandBoxMode(True))
        body: dict[str, Any] = mail.get()
        return _without_repeated_recipients(body)

    async def send(self, message: RenderedMessage) -> SendResult:
        """Hand one email to SendGrid; returns its ``X-Message-Id``. Raises from ``providers.errors``."""
        payload = json.dumps(self.body(message), separators=(",", ":"), ensure_ascii=False).encode()
        with transport_errors(provider=self.name, label="SendGrid"):
            async with self._http.get().post(self._url, data=payload) as response:
                status, headers = response.status, response.headers
                raw = await response.read()
        if 200 <= status < 300:
            # Sandbox mode answers 200 and may omit X-Message-Id.
            message_id = headers.get("X-Message-Id") or f"sandbox-{message.notification_id}"
            return SendResult(provider=self.name, provider_message_id=message_id, http_status=status)
        raise self._classify(status, headers, raw)

    def _classify(self, status: int, headers: Mapping[str, str], raw: bytes) -> ProviderError:
        errors = _errors(raw)
        code = f"http_{status}"
        text = f"SendGrid refused the message: {status}: " + "; ".join(
            f"{e.get('field') or '-'}: {e.get('message', '')}" for e in errors
        )
        return refusal(
            text,
            provider=self.name,
            code=code,
            http_status=status,
            invalid_recipient=status == 400
            and any(_RECIPIENT_FIELD.match(str(e.get("field") or "")) for e in errors),
            transient=overloaded(status),
            retry_after_s=_retry_after_s(status, headers),
        )

    async def aclose(self) -> None:
        """Close the connection pool; a later ``send`` opens a new one."""
        await self._http.aclose()


def _address(kind: type[_E], address: str, name: str | None = None) -> _E:
    """A ``From``/``To`` holding ``address`` verbatim (the SDK would re-parse a bare address)."""
    email = kind(name=name)
    email.email = address
    return email


def _retry_after_s(status: int, headers: Mapping[str, str]) -> float | None:
    """The provider's hint: ``X-RateLimit-Reset`` only on a 429 (SendGrid sends that header on every
    response, so on a 5xx it says nothing about when the outage ends), else ``Retry-After``."""
    reset = headers.get("X-RateLimit-Reset") if status == 429 else None
    if reset:
        try:
            return max(0.0, float(reset) - time.time())
        except ValueError:
            pass
    return parse_retry_after(headers.get("Retry-After"))


def _errors(raw: bytes) -> list[dict[str, Any]]:
    errors = json_object(raw).get("errors")
    return [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []


def _without_repeated_recipients(body: dict[str, Any]) -> dict[str, Any]:
    """SendGrid refuses a request whose personalization repeats an address across to/cc/bcc
    (docs/providers.md 7.4): keep each address's first appearance (case-insensitive)."""
    for person in body.get("personalizations", []):
        seen: set[str] = set()
        for kind in ("to", "cc", "bcc"):
            if kind in person:
                kept = [a for a in person[kind] if not _first_sight(seen, str(a.get("email", "")))]
                person[kind] = kept
                if not kept:
                    del person[kind]
    return body


def _first_sight(seen: set[str], email: str) -> bool:
    """True if ``email`` was already seen (and so must be dropped)."""
    key = email.lower()
    if key in seen:
        return True
    seen.add(key)
    return False
