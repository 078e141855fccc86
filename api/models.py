"""Request and response bodies of the v1 API."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import phonenumbers
from email_validator import EmailNotValidError, validate_email
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from api.engagement_models import EngagementOut
from api.refusal_text import MAX_TEXT_CHARS, excerpt, shown
from core.devices import MAX_TOKEN_CHARS
from core.horizon import MAX_WAIT
from providers.fcm import reserved_data_key
from schema.enums import Channel, Platform, Priority

E164 = re.compile(r"^\+[1-9]\d{6,14}$")
NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"


def check_phone(value: str | None) -> str | None:
    return None if value is None else _valid_phone(value)


# Validation is pure and the same users are sent to again and again: remember the answers
# (a refused value raises and is not remembered).
@lru_cache(maxsize=65_536)
def _valid_phone(value: str) -> str:
    if not E164.match(value):
        raise ValueError(f"{shown(value)} is not an E.164 phone number (like +14155550100)")
    try:
        parsed = phonenumbers.parse(value, None)
    except phonenumbers.NumberParseException as exc:
        raise ValueError(f"{shown(value)} is not a phone number: {exc}") from None
    if not phonenumbers.is_possible_number(parsed):
        raise ValueError(f"{shown(value)} is not a possible phone number")
    return value


def check_email(value: str | None) -> str | None:
    return None if value is None else _normalized_email(value)


@lru_cache(maxsize=65_536)
def _normalized_email(value: str) -> str:
    try:
        return validate_email(value, check_deliverability=False).normalized
    except EmailNotValidError as exc:
        raise ValueError(
            f"{shown(value)} is not a valid email address: {excerpt(str(exc), MAX_TEXT_CHARS)}"
        ) from None


# APNS device tokens are hex (32 bytes today; Apple warns the length may grow). FCM registration
# tokens are URL-safe text, usually ~160 characters, sometimes with a ':' separator.
_APNS_TOKEN = re.compile(r"^[0-9a-fA-F]{64,200}$")
_FCM_TOKEN = re.compile(rf"^[A-Za-z0-9_\-:]{{32,{MAX_TOKEN_CHARS}}}$")


def check_timezone(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"{shown(value)} is not an IANA timezone name (like Europe/Lisbon)") from None
    return value


def check_device_token(platform: Platform, token: str) -> str:
    """The one rule for a device token, inline in a send or through /v1/users (an APNS token that
    is not hex went to APNs and came back BadDeviceToken)."""
    if platform is Platform.apns and not _APNS_TOKEN.match(token):
        raise ValueError("an APNS device token is 64 or more hexadecimal characters")
    if platform is Platform.fcm and not _FCM_TOKEN.match(token):
        raise ValueError("an FCM registration token is 32 or more characters of A-Z a-z 0-9 _ - :")
    return token


MAX_DATA_DEPTH = 32
# What a single send's 64 KiB body can hold at most (a value and its comma are 2 bytes). A batch item
# may carry up to the batch's 4 MB: one of 1.9 million numbers held the event loop 1.7 s on its way
# through the checks, pydantic's copy, the request's hash and the insert's JSON (2026-11-28, a
# helper's probe), another tenant's accept p99 going to 1.65 s.
MAX_VALUES = 32_768


def check_text_tree(
    value: Any, *, field: str, max_depth: int = MAX_DATA_DEPTH, max_values: int = MAX_VALUES
) -> None:
    """Refuse a JSON value nested deeper than ``max_depth``, holding more than ``max_values``
    values, or holding text no provider can carry (a lone surrogate, which ``"\\ud800"`` in JSON
    decodes to). Iterative: depth costs no stack.

    Only containers go on the stack, and a value's path is spelled only for a container or a
    refusal: a batch item's ``data`` may hold millions of numbers in its 4 MB, and a path and a
    stack entry for each made this 1.4 s of the event loop for 1.9 million (2026-11-28)."""
    stack: list[tuple[Any, str, int]] = [(value, field, 0)]
    values = 0
    while stack:
        item, path, depth = stack.pop()
        if depth > max_depth:
            raise ValueError(f"'{field}' is nested deeper than {max_depth} levels")
        if isinstance(item, (dict, list)):
            values += len(item)
            if values > max_values:
                raise ValueError(f"'{field}' holds more than {max_values:,} values")
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, dict):
            if item and depth + 1 > max_depth:
                raise ValueError(f"'{field}' is nested deeper than {max_depth} levels")
            for key, child in item.items():
                _check_text(str(key), path)
                if isinstance(child, (dict, list)):
                    stack.append((child, f"{path}.{key}", depth + 1))
                elif isinstance(child, str) and not child.isascii():
                    _check_text(child, f"{path}.{key}")
        elif isinstance(item, list):
            if item and depth + 1 > max_depth:
                raise ValueError(f"'{field}' is nested deeper than {max_depth} levels")
            for i, child in enumerate(item):
                if isinstance(child, (dict, list)):
                    stack.append((child, f"{path}[{i}]", depth + 1))
                elif isinstance(child, str) and not child.isascii():
                    _check_text(child, f"{path}[{i}]")


def _check_text(text: str, path: str) -> None:
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise ValueError(
                f"'{path[:200]}' holds text that is not valid Unicode (a lone surrogate)"
            ) from None


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceIn(Strict):
    platform: Platform
    token: str = Field(min_length=8, max_length=MAX_TOKEN_CHARS, pattern=r"^[A-Za-z0-9_:\-.]+$")

    @model_validator(mode="after")
    def _token_format(self) -> DeviceIn:
        check_device_token(self.platform, self.token)
        return self


class UserIn(Strict):
    id: str = Field(
        min_length=1,
        max_length=255,
        description="your id for the user (external id); a new one: printable characters only, no whitespace at either end",
    )
    email: str | None = Field(default=None, max_length=320)
    phone: str | None = Field(default=None, description="E.164, like +14155550100")
    devices: list[DeviceIn] = Field(default_factory=list, max_length=50)
    locale: str | None = Field(default=None, max_length=35, pattern=r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})*$")
    timezone: str | None = Field(default=None, max_length=64)

    _phone = field_validator("phone")(check_phone)
    _email = field_validator("email")(check_email)
    _tz = field_validator("timezone")(check_timezone)


class ContentIn(Strict):
    subject: str | None = Field(
        default=None, max_length=998, description="email subject (required for email)"
    )
    title: str | None = Field(default=None, max_length=998, description="push title")
    body: str = Field(min_length=1, max_length=32_000)
    html: str | None = Field(default=None, max_length=60_000)


class NotificationIn(Strict):
    event_id: str = Field(
        min_length=1,
        max_length=255,
        description="your idempotency key, unique per tenant; a new one: printable characters only, no whitespace at either end",
    )
    user: UserIn | None = Field(
        default=None, description="the recipient, upserted with these contact details"
    )
    user_id: str | None = Field(default=None, min_length=1, max_length=255, description="a known user's id")
    channel: Channel
    category: str = Field(default="general", min_length=1, max_length=64, pattern=NAME)
    priority: Priority = Priority.normal
    template: str | None = Field(default=None, min_length=1, max_length=128, pattern=NAME)
    template_version: int | None = Field(default=None, ge=1, le=2_147_483_647)
    content: ContentIn | None = None
    data: dict[str, Any] = Field(
        default_factory=dict, description=f"template data; JSON nested at most {MAX_DATA_DEPTH} levels"
    )
    send_at: AwareDatetime | None = Field(
        default=None,
        description=f"with a time zone, e.g. ...Z; at most {MAX_WAIT.days} days ahead",
    )
    expires_at: AwareDatetime | None = Field(default=None, description="with a time zone, e.g. ...Z")

    @field_validator("send_at")
    @classmethod
    def _near_enough(cls, value: datetime | None) -> datetime | None:
        if value is not None and value > datetime.now(UTC) + MAX_WAIT:
            raise ValueError(
                f"a send may be scheduled at most {MAX_WAIT.days} days ahead; "
                "keep later ones in your own scheduler"
            )
        return value

    @model_validator(mode="before")
    @classmethod
    def _valid_text(cls, value: Any) -> Any:
        check_text_tree(value, field="body", max_depth=MAX_DATA_DEPTH + 3)
        return value

    @model_validator(mode="after")
    def _one_of(self) -> NotificationIn:
        if self.channel is Channel.push:
            for key in self.data:
                # FCM refuses these keys (400 INVALID_ARGUMENT): a push carrying one would fail at
                # the provider for good, so it is refused here, naming the key.
                if reserved_data_key(key):
                    raise ValueError(
                        f"data key {shown(key)} is reserved by FCM (from, message_type, or starting "
                        "with google or gcm): a push carrying it would be refused; rename it"
                    )
        if (self.user is None) == (self.user_id is None):
            raise ValueError("give exactly one of 'user' (with contact details) or 'user_id'")
        if (self.template is None) == (self.content is None):
            raise ValueError("give exactly one of 'template' or inline 'content'")
        if self.template_version is not None and self.template is None:
            raise ValueError("'template_version' needs 'template'")
        if (
            self.channel is Channel.email
            and self.content is not None
            and not (self.content.subject or "").strip()
        ):
            # As an email template must have one (api/templates_service.py): SendGrid and SMTP
            # refuse an email without a subject, which would fail only after the 202.
            raise ValueError("an email needs 'content.subject'")
        return self

    @property
    def external_user_id(self) -> str:
        return self.user.id if self.user is not None else str(self.user_id)


class Accepted(BaseModel):
    id: UUID
    status: str
    duplicate: bool = False


MAX_BATCH = 1000


class BatchIn(Strict):
    notifications: list[dict[str, Any]] = Field(
        min_length=1,
        max_length=MAX_BATCH,
        description="up to 1,000 sends, each shaped like POST /v1/notifications",
    )


class BatchItemOut(BaseModel):
    index: int
    id: UUID | None = None
    status: str | None = None
    duplicate: bool = False
    error: dict[str, Any] | None = None


class BatchOut(BaseModel):
    accepted: int
    duplicates: int
    rejected: int
    results: list[BatchItemOut]


class Cancelled(BaseModel):
    id: UUID
    status: str


class Transition(BaseModel):
    status: str
    at: datetime
    detail: str | None = None


class AttemptOut(BaseModel):
    attempt: int
    provider: str
    started_at: datetime
    finished_at: datetime
    outcome: str
    error_code: str | None = None
    error_message: str | None = None
    http_status: int | None = None
    provider_message_id: str | None = None


class ErrorInfo(BaseModel):
    code: str
    message: str | None = None


class NotificationOut(BaseModel):
    id: UUID
    event_id: str
    user_id: str
    channel: Channel
    category: str
    priority: Priority
    template: str | None
    template_version: int | None
    status: str
    attempts: int
    provider: str | None
    provider_message_id: str | None
    error: ErrorInfo | None
    created_at: datetime
    updated_at: datetime
    history: list[Transition]
    delivery_attempts: list[AttemptOut] = Field(default_factory=list)
    engagement: list[EngagementOut] = Field(
        default_factory=list,
        description="what happened after the send, one entry per type and link (shown by GET of one notification)",
    )


class SandboxMessageOut(BaseModel):
    notification_id: UUID
    channel: str
    recipient: str
    subject: str | None
    body: str
    html: str | None
    data: dict[str, Any]
    provider_message_id: str
    created_at: datetime
