"""The Kafka message contract shared by the API, the relay and the workers.

Topics per channel: ``notifications.<channel>`` (main lane), ``.bulk`` (bulk priority, so a marketing
backlog never delays an OTP), ``.retry`` and ``.dlq``. Key: the recipient user id. Header
``traceparent``: the notification's trace, when it has one (``clarion.tracing``).
"""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from pydantic import BaseModel, Field

from schema.enums import Channel, Priority

SCHEMA_VERSION: Literal[1] = 1
LANES = ("main", "bulk", "retry", "dlq")


class NotificationMessage(BaseModel):
    schema_version: Literal[1] = SCHEMA_VERSION
    id: UUID
    tenant_id: str
    channel: Channel
    user_id: UUID
    priority: Priority = Priority.normal
    traceparent: str | None = Field(default=None, exclude=True)
    """The W3C trace context the notification's spans continue; it travels in the record's
    ``traceparent`` header, never in its value (so the value's contract is unchanged)."""

    def key(self) -> bytes:
        return self.user_id.bytes


def topic(channel: Channel | str, lane: str = "main") -> str:
    base = f"notifications.{Channel(channel).value}"
    return base if lane == "main" else f"{base}.{lane}"


def lane_for(priority: Priority | str) -> str:
    return "bulk" if Priority(priority) is Priority.bulk else "main"


def all_topics() -> list[str]:
    return [topic(ch, lane) for ch in Channel for lane in LANES]
