"""Request and response bodies of the Clarion API, as typed models.

Each model mirrors one schema of the API's OpenAPI document (``SCHEMAS`` maps them); the client's
test suite fails when a field is added, renamed or dropped on either side. Responses ignore fields
they do not know (an API newer than the client still parses); requests refuse unknown fields.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

Channel = Literal["push", "sms", "email"]
Priority = Literal["critical", "high", "normal", "low"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="ignore")


# Requests


class Device(_Request):
    platform: Literal["fcm", "apns"]
    token: str


class Recipient(_Request):
    """The user a send is for, with contacts kept on the user (``PUT /v1/users/{id}`` later)."""

    id: str
    email: str | None = None
    phone: str | None = None
    locale: str | None = None
    timezone: str | None = None
    devices: list[Device] | None = None


class Content(_Request):
    """Inline content instead of a stored template."""

    body: str
    subject: str | None = None
    title: str | None = None
    html: str | None = None


class Notification(_Request):
    """One send: ``event_id`` is your idempotency key (a retry with it never sends twice)."""

    event_id: str
    channel: Channel
    user: Recipient | None = None
    user_id: str | None = None
    category: str | None = None
    priority: Priority | None = None
    template: str | None = None
    template_version: int | None = None
    content: Content | None = None
    data: dict[str, Any] | None = None
    send_at: datetime | None = None
    expires_at: datetime | None = None


class QuietHours(_Request):
    start: str = Field(description="HH:MM in the user's time zone")
    end: str


class UserProfile(_Request):
    email: str | None = None
    phone: str | None = None
    locale: str | None = None
    timezone: str | None = None
    quiet_hours: QuietHours | None = None


class Preference(_Request):
    channel: Literal["email", "sms", "push", "*"]
    category: str
    opted_in: bool


class TemplateIn(_Request):
    name: str
    channel: Channel
    body: str
    locale: str | None = None
    subject: str | None = None
    title: str | None = None
    html: str | None = None
    sample_data: dict[str, Any] | None = None
    activate: bool | None = None
    track_email: bool | None = None


class PreviewIn(_Request):
    channel: Channel
    locale: str | None = None
    version: int | None = None
    data: dict[str, Any] | None = None


# Responses


class ErrorInfo(_Response):
    code: str
    message: str | None = None


class Accepted(_Response):
    id: UUID
    status: str
    duplicate: bool = False


class BatchItem(_Response):
    index: int
    id: UUID | None = None
    status: str | None = None
    duplicate: bool = False
    error: ErrorInfo | None = None


class BatchResult(_Response):
    accepted: int
    duplicates: int
    rejected: int
    results: list[BatchItem]


class Transition(_Response):
    status: str
    at: datetime
    detail: str | None = None


class Attempt(_Response):
    attempt: int
    provider: str
    started_at: datetime
    finished_at: datetime
    outcome: str
    error_code: str | None = None
    error_message: str | None = None
    http_status: int | None = None
    provider_message_id: str | None = None


class Engagement(_Response):
    """What happened after the send: one per type (and clicked link), with its first/last time."""

    type: Literal["delivered", "bounced", "opened", "clicked", "unsubscribed", "complained"]
    link: str | None
    first_at: datetime
    last_at: datetime
    count: int
    source: str


class EngagementRecorded(Engagement):
    notification_id: UUID
    duplicate: bool


class EngagementReport(_Request):
    """An open or a click a person made, as your backend saw it (``report_engagement``)."""

    type: Literal["opened", "clicked"]
    link: str | None = None
    occurred_at: datetime | None = None


class NotificationStatus(_Response):
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
    delivery_attempts: list[Attempt] = []
    engagement: list[Engagement] = []


class Cancelled(_Response):
    id: UUID
    status: str


class DeviceOut(_Response):
    platform: str
    token: str
    active: bool
    last_error: str | None
    created_at: datetime


class User(_Response):
    id: str
    email: str | None
    phone: str | None
    locale: str | None
    timezone: str | None
    quiet_hours: dict[str, str] | None
    devices: list[DeviceOut]
    created_at: datetime
    updated_at: datetime


class Category(_Response):
    name: str
    default_opted_in: bool = True
    required: bool = False
    email_quiet_hours: bool = False


class Preferences(_Response):
    preferences: list[Preference]
    categories: list[Category]
    effective: dict[str, dict[str, bool]] = Field(
        description="category (or '*' for any other) -> channel -> whether it is delivered"
    )


class Template(_Response):
    name: str
    channel: Channel
    locale: str
    version: int
    active: bool
    subject: str | None
    title: str | None
    body: str
    html: str | None
    track_email: bool | None = None
    sample_data: dict[str, Any] | None
    created_at: datetime


class Preview(_Response):
    name: str
    channel: Channel
    locale: str
    version: int
    subject: str | None
    title: str | None
    body: str
    html: str | None


class AnalyticsRow(_Response):
    at: datetime
    group: dict[str, str | int]
    counts: dict[str, int]
    rates: dict[str, float | None]


class AnalyticsPage(_Response):
    since: datetime
    until: datetime
    interval: Literal["hour", "day"]
    group_by: list[str]
    rows: list[AnalyticsRow]
    next_cursor: str | None = Field(description="the next page's `cursor`; None on the last page")


# Client model -> the schema it mirrors in /openapi.json (checked by the client's tests).
SCHEMAS: dict[type[BaseModel], str] = {
    Device: "api__models__DeviceIn",
    Recipient: "api__models__UserIn",
    Content: "api__models__ContentIn",
    Notification: "NotificationIn",
    QuietHours: "QuietHours",
    UserProfile: "UserProfileIn",
    Preference: "PreferenceIn",
    TemplateIn: "TemplateIn",
    PreviewIn: "PreviewIn",
    ErrorInfo: "ErrorInfo",
    Accepted: "Accepted",
    BatchItem: "BatchItemOut",
    BatchResult: "BatchOut",
    Transition: "Transition",
    Attempt: "AttemptOut",
    NotificationStatus: "NotificationOut",
    Engagement: "EngagementOut",
    EngagementRecorded: "EngagementRecorded",
    EngagementReport: "EngagementIn",
    Cancelled: "Cancelled",
    DeviceOut: "DeviceOut",
    User: "UserOut",
    Category: "CategoryOut",
    Preferences: "PreferencesOut",
    Template: "TemplateOut",
    Preview: "PreviewOut",
    AnalyticsRow: "AnalyticsRow",
    AnalyticsPage: "AnalyticsPage",
}
