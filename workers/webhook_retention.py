"""Daily partitions of the webhook log and delivery queue: days ahead created, expired days dropped.

Both tables grow with every send (``core.webhook_events``). ``clarion webhooks`` runs
``maintain`` at start and every hour (several processes may: every step is idempotent). A day of
``webhook_deliveries`` still holding a pending delivery is kept whole until it is done.
"""

from __future__ import annotations

import datetime as dt
import logging

import asyncpg

from schema.partition_drops import drop_expired
from schema.partitions import days_ahead, default_rows, ensure_ahead

log = logging.getLogger(__name__)

PARENTS = {"webhook_events": None, "webhook_deliveries": "state = 'pending'"}
DAYS_AHEAD = 3


async def maintain(*, pool: asyncpg.Pool, today: dt.date, retention_days: int) -> list[str]:
    """Create today's partition and ``DAYS_AHEAD`` more, drop days past ``retention_days``;
    returns the partitions dropped."""
    dropped: list[str] = []
    async with pool.acquire() as conn:
        for parent, live_filter in PARENTS.items():
            await ensure_ahead(conn, parent=parent, today=today, days_ahead=DAYS_AHEAD)
            dropped += await drop_expired(
                conn, parent=parent, today=today, retention_days=retention_days, live_filter=live_filter
            )
            if await days_ahead(conn, parent=parent, today=today) < DAYS_AHEAD or await default_rows(
                conn, parent=parent
            ):
                log.warning("%s: a day was missing its partition (rows in %s_default)", parent, parent)
    if dropped:
        log.info("webhook retention dropped %s", ", ".join(dropped))
    return dropped
