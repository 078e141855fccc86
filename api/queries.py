"""Read models: a notification with its history and attempts, sandbox messages."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.engagement_models import EngagementOut
from api.models import AttemptOut, ErrorInfo, NotificationOut, SandboxMessageOut, Transition
from schema.ids import created_window
from schema.log_models import DeliveryAttempt, Engagement, Notification, SandboxMessage
from schema.models import User
from schema.shown_status import shown_history, shown_status

_n = Notification.__table__  # type: ignore[attr-defined]
_u = User.__table__  # type: ignore[attr-defined]
_a = DeliveryAttempt.__table__  # type: ignore[attr-defined]
_s = SandboxMessage.__table__  # type: ignore[attr-defined]
_e = Engagement.__table__  # type: ignore[attr-defined]
MAX_SHOWN = 200  # engagement rows shown: the types, and clicks on at most core.engagement.MAX_LINKS links


def notification_out(row: Any, attempts: list[Any], engagement: list[Any] | None = None) -> NotificationOut:
    return NotificationOut(
        id=row.id,
        event_id=row.event_id,
        user_id=row.external_id,
        channel=row.channel,
        category=row.category,
        priority=row.priority,
        template=row.template,
        template_version=row.template_version,
        status=shown_status(status=row.status, queued_at=row.queued_at),
        attempts=row.attempts,
        provider=row.provider,
        provider_message_id=row.provider_message_id,
        error=ErrorInfo(code=row.error_code, message=row.error_message) if row.error_code else None,
        created_at=row.created_at,
        updated_at=row.updated_at,
        history=[
            Transition.model_validate(h) for h in shown_history(history=row.history, queued_at=row.queued_at)
        ],
        delivery_attempts=[AttemptOut.model_validate(a, from_attributes=True) for a in attempts],
        engagement=[
            EngagementOut(
                type=e.type,
                link=e.link or None,
                first_at=e.first_at,
                last_at=e.last_at,
                count=e.count,
                source=e.source,
            )
            for e in engagement or ()
        ],
    )


async def get_notification(
    engine: AsyncEngine, *, tenant_id: str, notification_id: UUID
) -> NotificationOut | None:
    """The notification with its transitions and provider calls, or None (also for another tenant's id)."""
    since, until = created_window([notification_id])
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                sa.select(_n, _u.c.external_id)
                .join(_u, _u.c.id == _n.c.user_id)
                .where(_n.c.id == notification_id, _n.c.tenant_id == tenant_id)
                .where(_n.c.created_at.between(since, until))
            )
        ).first()
        if row is None:
            return None
        attempts = (
            await conn.execute(
                sa.select(_a)
                .where(_a.c.notification_id == notification_id, _a.c.started_at >= since)
                .order_by(_a.c.id)
            )
        ).all()
        engagement = (
            await conn.execute(
                sa.select(_e)
                .where(
                    _e.c.notification_id == notification_id,
                    _e.c.tenant_id == tenant_id,
                    _e.c.notification_created_at == row.created_at,  # one partition, not every day
                )
                .order_by(_e.c.first_at, _e.c.type, _e.c.link)
                .limit(MAX_SHOWN)
            )
        ).all()
    return notification_out(row, list(attempts), list(engagement))


async def sandbox_messages(
    engine: AsyncEngine, *, tenant_id: str, notification_id: UUID | None, limit: int
) -> list[SandboxMessageOut]:
    query = sa.select(_s).where(_s.c.tenant_id == tenant_id).order_by(_s.c.id.desc()).limit(limit)
    if notification_id is not None:
        query = query.where(
            _s.c.notification_id == notification_id, _s.c.created_at >= created_window([notification_id])[0]
        )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    return [SandboxMessageOut.model_validate(r, from_attributes=True) for r in rows]
