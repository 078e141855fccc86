"""Provider account settings (``CLARION_PROVIDERS__<PROVIDER>__<FIELD>``).

A provider whose credentials are unset is disabled, and its channel falls back to the sandbox. A
provider with only some of its credentials set is a configuration error, reported at startup rather
than silently falling back. ``base_url`` defaults to the real host; tests point it at a local fake.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field, SecretStr, model_validator

# Where the API receives Twilio's delivery status callbacks (api.routes.webhooks).
TWILIO_STATUS_CALLBACK_PATH = "/v1/webhooks/twilio/status"


class SandboxSettings(BaseModel):
    enabled: bool = Field(
        default=True,
        description="Use the sandbox provider for every channel that has no real provider configured.",
    )


class _AccountSettings(BaseModel):
    """Shared behaviour: ``configured`` when the credentials are complete, an error when half-set."""

    _credential_fields: ClassVar[tuple[str, ...]] = ()

    timeout_s: float = Field(default=10.0, gt=0, description="Whole-request timeout for one provider call.")
    max_connections: int = Field(
        default=100, ge=1, description="Connections kept open to the provider (HTTP/1.1 providers)."
    )

    @property
    def configured(self) -> bool:
        return not self._missing()

    def _missing(self) -> list[str]:
        raise NotImplementedError

    @model_validator(mode="after")
    def _refuse_partial_credentials(self) -> Any:
        if any(getattr(self, name) is not None for name in self._credential_fields) and self._missing():
            raise ValueError(f"incomplete provider credentials, missing: {', '.join(self._missing())}")
        return self


class ApnsSettings(_AccountSettings):
    _credential_fields = ("key_id", "team_id", "private_key", "private_key_path", "topic")

    key_id: str | None = Field(default=None, description="10-character Key ID of the .p8 signing key.")
    team_id: str | None = Field(default=None, description="10-character Apple Developer Team ID (JWT `iss`).")
    private_key: SecretStr | None = Field(default=None, description="The .p8 signing key, PEM text.")
    private_key_path: Path | None = Field(
        default=None, description="Path to the .p8 signing key (used when `private_key` is unset)."
    )
    topic: str | None = Field(default=None, description="The app's bundle ID, sent as `apns-topic`.")
    use_sandbox: bool = Field(
        default=False, description="Send to Apple's development environment (api.sandbox.push.apple.com)."
    )
    base_url: str | None = Field(
        default=None,
        description="APNs origin; unset means Apple's production or sandbox host per use_sandbox.",
    )
    ca_file: Path | None = Field(
        default=None,
        description="Extra CA bundle to trust for base_url (only for a local fake's certificate).",
    )
    # bench.providers could not tell 1 from 2 or 4 apart through this 2-core machine's noise (1,000-2,700
    # pushes/s each, 0.16-0.21 ms client CPU); 2 halves what one lost connection takes down with it.
    connections: int = Field(
        default=2,
        ge=1,
        le=16,
        description="HTTP/2 connections to APNs per worker process; each carries up to APNs' stream limit.",
    )
    token_refresh_s: float = Field(
        default=2700.0,
        ge=1200.0,
        le=3300.0,
        description="Age at which the provider JWT is re-minted (Apple: at most 1 h, at least 20 min apart).",
    )

    @property
    def endpoint(self) -> str:
        if self.base_url:
            return self.base_url.rstrip("/")
        return "https://api.sandbox.push.apple.com" if self.use_sandbox else "https://api.push.apple.com"

    def signing_key_pem(self) -> bytes:
        """The PEM bytes of the signing key, from ``private_key`` or ``private_key_path``."""
        if self.private_key is not None:
            return self.private_key.get_secret_value().encode()
        if self.private_key_path is not None:
            return self.private_key_path.read_bytes()
        raise ValueError("APNS signing key is not configured")

    def _missing(self) -> list[str]:
        missing = [name for name in ("key_id", "team_id", "topic") if getattr(self, name) is None]
        if self.private_key is None and self.private_key_path is None:
            missing.append("private_key or private_key_path")
        return missing


class FcmSettings(_AccountSettings):
    _credential_fields = ("service_account_json", "service_account_path")

    service_account_json: SecretStr | None = Field(
        default=None, description="Google service-account key file contents (JSON text)."
    )
    service_account_path: Path | None = Field(
        default=None, description="Path to the service-account key file (used when the JSON text is unset)."
    )
    project_id: str | None = Field(
        default=None, description="Firebase project ID; defaults to `project_id` in the service account."
    )
    base_url: str = Field(default="https://fcm.googleapis.com", description="FCM HTTP v1 origin.")
    token_uri: str | None = Field(
        default=None,
        description="OAuth2 token endpoint override; defaults to the service account's token_uri.",
    )

    def service_account_info(self) -> dict[str, Any]:
        """The parsed service-account key, with ``token_uri`` overridden when configured."""
        if self.service_account_json is not None:
            info: dict[str, Any] = json.loads(self.service_account_json.get_secret_value())
        elif self.service_account_path is not None:
            info = json.loads(self.service_account_path.read_text())
        else:
            raise ValueError("FCM service account is not configured")
        if self.token_uri:
            info["token_uri"] = self.token_uri
        return info

    def _missing(self) -> list[str]:
        if self.service_account_json is None and self.service_account_path is None:
            return ["service_account_json or service_account_path"]
        return []


class TwilioSettings(_AccountSettings):
    _credential_fields = (
        "account_sid",
        "auth_token",
        "api_key_sid",
        "api_key_secret",
        "from_number",
        "messaging_service_sid",
    )

    account_sid: str | None = Field(default=None, description="Account SID (AC + 32 hex), always in the URL.")
    auth_token: SecretStr | None = Field(
        default=None, description="Account auth token (Basic auth password; also signs webhooks)."
    )
    api_key_sid: str | None = Field(
        default=None, description="API key SID (SK...), used for Basic auth instead of the account SID."
    )
    api_key_secret: SecretStr | None = Field(default=None, description="Secret of the API key.")
    from_number: str | None = Field(
        default=None, description="Sender: E.164 number, short code or sender ID."
    )
    messaging_service_sid: str | None = Field(
        default=None,
        description="Messaging Service SID (MG...); Twilio picks the sender. Wins over from_number.",
    )
    status_callback_url: str | None = Field(
        default=None, description="URL Twilio POSTs delivery status changes to (`StatusCallback`)."
    )
    status_callbacks: bool = Field(
        default=False,
        description="Ask Twilio for delivery status callbacks at {public_url}/v1/webhooks/twilio/status "
        "(when status_callback_url is unset); they are verified with auth_token.",
    )
    base_url: str = Field(default="https://api.twilio.com", description="Twilio REST API origin.")

    def with_status_callback(self, public_url: str) -> TwilioSettings:
        """These settings, with ``status_callback_url`` pointing at Clarion's own status webhook
        under ``public_url`` when ``status_callbacks`` is on and no explicit URL is set."""
        if not self.status_callbacks or self.status_callback_url is not None:
            return self
        url = public_url.rstrip("/") + TWILIO_STATUS_CALLBACK_PATH
        return self.model_copy(update={"status_callback_url": url})

    def _missing(self) -> list[str]:
        missing = []
        if self.account_sid is None:
            missing.append("account_sid")
        if self.auth_token is None and (self.api_key_sid is None or self.api_key_secret is None):
            missing.append("auth_token or api_key_sid+api_key_secret")
        if self.from_number is None and self.messaging_service_sid is None:
            missing.append("from_number or messaging_service_sid")
        return missing


class SendGridSettings(_AccountSettings):
    _credential_fields = ("api_key", "from_email")

    api_key: SecretStr | None = Field(default=None, description="SendGrid API key (SG...) with mail.send.")
    from_email: str | None = Field(default=None, description="Verified sender address.")
    from_name: str | None = Field(default=None, description="Display name of the sender.")
    base_url: str = Field(
        default="https://api.sendgrid.com",
        description="SendGrid v3 origin (EU subusers: api.eu.sendgrid.com).",
    )
    sandbox_mode: bool = Field(
        default=False,
        description="Ask SendGrid to validate only, never deliver (mail_settings.sandbox_mode).",
    )
    webhook_public_key: str | None = Field(
        default=None,
        description="Event Webhook verification key (base64 DER, from Mail Settings); unset: "
        "POST /v1/webhooks/sendgrid/events answers 404.",
    )

    def _missing(self) -> list[str]:
        return [name for name in ("api_key", "from_email") if getattr(self, name) is None]


class SmtpSettings(_AccountSettings):
    """A secondary email route over SMTP, used when SendGrid is failing (see ``providers.smtp``)."""

    _credential_fields = ("host", "from_email")

    host: str | None = Field(default=None, description="SMTP server host name.")
    port: int = Field(default=587, ge=1, le=65535, description="SMTP server port (587 submission).")
    username: str | None = Field(default=None, description="SMTP AUTH user name; unset: no AUTH.")
    password: SecretStr | None = Field(default=None, description="SMTP AUTH password.")
    from_email: str | None = Field(default=None, description="Envelope and header sender address.")
    from_name: str | None = Field(default=None, description="Display name of the sender.")
    starttls: bool = Field(
        default=True, description="Upgrade the connection with STARTTLS (off only for a local relay)."
    )

    def _missing(self) -> list[str]:
        return [name for name in ("host", "from_email") if getattr(self, name) is None]


class ProvidersSettings(BaseModel):
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings, description="The sandbox provider.")
    apns: ApnsSettings = Field(default_factory=ApnsSettings, description="Apple Push Notification service.")
    fcm: FcmSettings = Field(default_factory=FcmSettings, description="Firebase Cloud Messaging (HTTP v1).")
    twilio: TwilioSettings = Field(
        default_factory=TwilioSettings, description="Twilio Programmable Messaging."
    )
    sendgrid: SendGridSettings = Field(default_factory=SendGridSettings, description="SendGrid Mail Send.")
    smtp: SmtpSettings = Field(
        default_factory=SmtpSettings, description="SMTP relay: the email failover route (aiosmtplib)."
    )
