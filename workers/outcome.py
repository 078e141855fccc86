"""What a delivery ends with: its ``Outcome`` and the ``Attempt`` row of every provider call."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from schema.enums import Status


@dataclass(slots=True, kw_only=True)
class Attempt:
    notification_id: UUID
    attempt: int
    provider: str
    recipient: str | None
    started_at: datetime
    finished_at: datetime
    outcome: str  # sent | transient | permanent | invalid_recipient
    error_code: str | None = None
    error_message: str | None = None
    http_status: int | None = None
    provider_message_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """Where one claimed notification ended up this time, and the provider calls it took."""

    notification_id: UUID
    status: Status
    calls: int = 0
    """Attempts to count against the notification's budget (provider calls, infrastructure faults)."""
    provider: str | None = None
    provider_message_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    not_before: datetime | None = None
    detail: str | None = None
    content_hash: str | None = None
    attempts: tuple[Attempt, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))  # a plain string is refused early
