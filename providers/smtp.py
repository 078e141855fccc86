"""Email over SMTP (aiosmtplib): the secondary email route when SendGrid is failing.

One connection per message: this route carries traffic only while the primary is down, and a
fresh connection avoids holding a session a relay may have timed out. SMTP reply codes classify
the failure: 4xx and connection problems are transient, 5xx permanent, and a 5xx on the recipient
(``RCPT TO``) an invalid recipient; an internationalized address the server cannot carry (no
SMTPUTF8) is permanent for that message.
"""

from __future__ import annotations

from email.message import EmailMessage
from email.utils import formataddr, make_msgid
from typing import ClassVar

import aiosmtplib

from providers.base import RenderedMessage, SendResult
from providers.errors import (
    InvalidRecipient,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)
from providers.headers import check_header_value
from providers.settings import SmtpSettings
from schema.enums import Channel


class SmtpProvider:
    """Sends email through one SMTP server (submission with optional STARTTLS and AUTH)."""

    name: ClassVar[str] = "smtp"
    channel: ClassVar[Channel] = Channel.email

    def __init__(self, settings: SmtpSettings) -> None:
        if settings.host is None or settings.from_email is None:
            raise ValueError("SMTP host and from_email are required")
        self._settings = settings
        self._domain = settings.from_email.rpartition("@")[2] or None

    def mime(self, message: RenderedMessage) -> EmailMessage:
        """The MIME message for one rendered email (text, plus an HTML alternative when given)."""
        if not message.subject:
            raise PermanentProviderError(
                "an email needs a subject", provider=self.name, code="missing_subject"
            )
        settings = self._settings
        assert settings.from_email is not None
        mime = EmailMessage()
        from_name = check_header_value(settings.from_name or "", provider=self.name, field="from name")
        mime["From"] = formataddr((from_name, settings.from_email))
        mime["To"] = message.to
        mime["Subject"] = check_header_value(message.subject, provider=self.name, field="subject")
        mime["Message-ID"] = make_msgid(idstring=str(message.notification_id), domain=self._domain)
        mime["X-Clarion-Notification-Id"] = str(message.notification_id)
        if message.unsubscribe_url:
            mime["List-Unsubscribe"] = f"<{message.unsubscribe_url}>"
            mime["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
        mime.set_content(message.body)
        if message.html:
            mime.add_alternative(message.html, subtype="html")
        return mime

    async def send(self, message: RenderedMessage) -> SendResult:
        """Hand one email to the SMTP server; returns its ``Message-ID``. Raises from ``providers.errors``."""
        settings = self._settings
        mime = self.mime(message)
        try:
            await aiosmtplib.send(
                mime,
                hostname=settings.host,
                port=settings.port,
                username=settings.username,
                password=settings.password.get_secret_value() if settings.password else None,
                start_tls=settings.starttls,
                timeout=settings.timeout_s,
            )
        except aiosmtplib.SMTPRecipientsRefused as exc:
            raise self._classify(exc.recipients[0]) from exc
        except aiosmtplib.SMTPResponseException as exc:
            raise self._classify(exc) from exc
        except aiosmtplib.SMTPNotSupported as exc:
            if message.to.isascii():  # an extension the account needs (STARTTLS, AUTH): as before
                raise _unreachable(exc) from exc
            # An internationalized address (which the API accepts) needs SMTPUTF8, which this server
            # does not offer: the server works, and no retry can carry it. As a transient error,
            # one tenant's ten such emails opened the SMTP breaker for every tenant.
            raise PermanentProviderError(
                f"the SMTP server cannot carry a non-ASCII address (no SMTPUTF8): {exc}",
                provider=self.name,
                code="smtputf8_unsupported",
            ) from exc
        except (aiosmtplib.SMTPException, OSError) as exc:
            raise _unreachable(exc) from exc
        return SendResult(provider=self.name, provider_message_id=str(mime["Message-ID"]).strip("<>"))

    def _classify(self, exc: aiosmtplib.SMTPResponseException) -> ProviderError:
        text = f"SMTP server refused the message: {exc.code} {exc.message}"
        code = f"smtp_{exc.code}"
        if 400 <= exc.code < 500:
            return TransientProviderError(text, provider=self.name, code=code)
        if isinstance(exc, aiosmtplib.SMTPRecipientRefused):
            return InvalidRecipient(text, provider=self.name, code=code)
        return PermanentProviderError(text, provider=self.name, code=code)

    async def aclose(self) -> None:
        """Nothing to close: each send uses its own connection."""


def _unreachable(exc: Exception) -> TransientProviderError:
    code = "timeout" if isinstance(exc, TimeoutError) else "connection_error"
    return TransientProviderError(f"SMTP server unreachable: {exc!r}", provider="smtp", code=code)
