"""Expiry: a notification whose ``expires_at`` passed before it could be sent is not sent.

The last screen after the claim (``workers.steps``): preferences and quiet hours judge first, so
an opted-out notification is ``suppressed`` even if it also expired.
"""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import UUID

from schema.enums import Status
from workers.claim import ClaimedNotification
from workers.outcome import Outcome


class ExpiryScreen:
    name = "expiry"

    async def screen(self, rows: list[ClaimedNotification]) -> dict[UUID, Outcome]:
        now = datetime.now(UTC)
        return {
            n.id: Outcome(
                notification_id=n.id,
                status=Status.expired,
                error_code="expired",
                error_message="the notification's expires_at passed before it could be sent",
            )
            for n in rows
            if n.expires_at is not None and n.expires_at <= now
        }
