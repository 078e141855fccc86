"""Changing a notification's course after it was accepted: cancelling."""

from __future__ import annotations

from uuid import UUID

import asyncpg

from api.errors import ApiError
from schema.ids import created_window

CANCEL = """
UPDATE notifications
   SET status = 'cancelled', not_before = NULL, updated_at = now(),
       history = history || jsonb_build_array(jsonb_build_object(
           'status', 'cancelled',
           'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
           'detail', 'cancelled by the API'))
 WHERE id = $1 AND tenant_id = $2 AND created_at BETWEEN $3 AND $4
   AND status IN ('accepted', 'queued', 'scheduled', 'delayed', 'retrying')
RETURNING status
"""


async def cancel_notification(*, pool: asyncpg.Pool, tenant_id: str, notification_id: UUID) -> str:
    """Cancel a notification that no worker is sending; returns the new status (``cancelled``).

    A cancelled notification is never claimed again, so no provider call follows. Raises 404 for
    an unknown id (or another tenant's) and 409 when it is being sent or already finished.
    """
    async with pool.acquire() as conn:
        window = created_window([notification_id])
        if await conn.fetchval(CANCEL, notification_id, tenant_id, *window):
            return "cancelled"
        status = await conn.fetchval(
            "SELECT status FROM notifications WHERE id = $1 AND tenant_id = $2 AND created_at BETWEEN $3 AND $4",
            notification_id, tenant_id, *window,
        )  # fmt: skip
    if status is None:
        raise ApiError(404, "not_found", f"No notification {notification_id}.")
    if status == "cancelled":
        return "cancelled"
    raise ApiError(
        409,
        "not_cancellable",
        f"The notification is {status}; only a notification not yet being sent can be cancelled.",
        {"status": status},
    )
