"""Daily partitions of the webhook log and delivery queue: days ahead created, expired days dropped.

Both tables grow with every send (``core.webhook_events``). ``clarion webhooks`` makes today's
and tomorrow's days before its first claim (``make_days``), then runs ``maintain`` at once and
every hour (several processes may: every step is idempotent). A day of ``webhook_deliveries``
still holding a pending delivery is kept whole until it is done.

A row of a day without its partition lands in the default partition (a fresh install, whose
migration made only the defaults; the process stopped for days), and making the day moves it out:
a record of a call racing that move has to run again (``webhook_record._update_ours``), and a
write queueing an event then is refused and tried again (an engagement report:
``clarion.missing_days.once_more_if_moved``; the worker's record: ``until_done``). Made before the
first claim, the days are there before any delivery of them is sent, and while the process runs
no delivery is queued into a default.

A delivery to an enabled endpoint is done within its retries (15 calls, about 5 hours of backoff), but
a disabled endpoint's deliveries wait for it to be enabled again, for ever: a tenant that disabled
an endpoint holding pending deliveries every day would have kept every day of the table, every
tenant's rows in it, for ever. So a delivery of a disabled (or deleted) endpoint still pending when
its day leaves retention is cancelled first (``EXPIRE``), and its day goes; its event had gone
with ``webhook_events``' day already, so no replay could have sent it again.
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
EXPIRE = """
UPDATE webhook_deliveries d
   SET state = 'cancelled',
       last_error = 'expired: its endpoint was disabled past the webhook retention'
 WHERE d.state = 'pending' AND d.created_at < $1
   AND NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = d.endpoint_id AND e.enabled)
"""


async def make_days(*, pool: asyncpg.Pool, today: dt.date, days_ahead: int = 1) -> list[str]:
    """Create today's partition of both tables and ``days_ahead`` more, dropping nothing (what
    ``clarion webhooks`` does before its first claim); returns the names created."""
    created: list[str] = []
    async with pool.acquire() as conn:
        for parent in PARENTS:
            created += await ensure_ahead(conn, parent=parent, today=today, days_ahead=days_ahead)
    return created


async def maintain(*, pool: asyncpg.Pool, today: dt.date, retention_days: int) -> list[str]:
    """Create today's partition and ``DAYS_AHEAD`` more, drop days past ``retention_days``;
    returns the partitions dropped."""
    dropped: list[str] = []
    cutoff = dt.datetime.combine(today - dt.timedelta(days=retention_days), dt.time(), tzinfo=dt.UTC)
    async with pool.acquire() as conn:
        expired = await conn.execute(EXPIRE, cutoff)
        if expired != "UPDATE 0":
            log.info("webhook retention cancelled %s deliveries of disabled endpoints", expired.split()[-1])
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
