"""The contract between the delivery pipeline and every provider adapter."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Protocol
from uuid import UUID

from schema.enums import Channel, Priority


@dataclass(frozen=True, slots=True)
class RenderedMessage:
    """One message to one address, fully rendered: all a provider needs to make one call.

    ``to`` is an email address (email), an E.164 number (sms) or a device token (push, with
    ``platform`` naming ``apns`` or ``fcm``). For push, ``subject`` is the title and ``data`` the
    tenant's JSON values (plus Clarion's own text ones), which each adapter encodes for its provider.
    """

    notification_id: UUID
    tenant_id: str
    channel: Channel
    to: str
    body: str
    priority: Priority = Priority.normal
    category: str = "general"
    subject: str | None = None
    html: str | None = None
    platform: str | None = None
    data: dict[str, Any] = field(default_factory=dict)  # push: JSON values, as the tenant sent them
    unsubscribe_url: str | None = None
    collapse_id: str | None = None
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class SendResult:
    """What the provider said when it accepted the message."""

    provider: str
    provider_message_id: str
    segments: int = 1
    http_status: int | None = None


class Provider(Protocol):
    """One outbound provider account. ``send`` raises from ``providers.errors`` on failure."""

    name: ClassVar[str]
    channel: ClassVar[Channel]

    async def send(self, message: RenderedMessage) -> SendResult: ...

    async def aclose(self) -> None: ...
