"""The notification log's size and reach, for ``GET /v1/ops/queues`` (and so ``clarion status``
and the /ops page): how many bytes it holds, the oldest day kept, the days of partitions ahead.

The size is every tenant's data: a tenant admin sees the log's reach (how far back its history
goes) but not its bytes, which only the platform operator's view carries.
"""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.log_maintenance import log_size, utc_today


class LogOut(BaseModel):
    retention_days: int = Field(
        description="CLARION_RETENTION_DAYS: days kept (a day with a live send longer)"
    )
    oldest_day: dt.date | None = Field(description="the oldest UTC day of notifications still kept")
    days_kept: int = Field(description="days of notifications kept, today included")
    total_bytes: int | None = Field(
        description="bytes of the log's tables and indexes (operator view only; None for a tenant)"
    )
    partitions_ahead: int = Field(
        description="whole days after today with partitions (the least over tables)"
    )
    default_rows: int = Field(description="rows in a default partition (a day was missing; should be 0)")


async def read_log(*, engine: AsyncEngine, retention_days: int, operator: bool) -> LogOut:
    """The log's figures now; ``operator`` adds its size in bytes."""
    async with engine.connect() as conn:
        raw = await conn.get_raw_connection()
        size = await log_size(conn=raw.driver_connection, today=utc_today())
    return LogOut(
        retention_days=retention_days,
        oldest_day=size.oldest_day,
        days_kept=size.days_kept,
        total_bytes=size.total_bytes if operator else None,
        partitions_ahead=size.partitions_ahead,
        default_rows=size.default_rows,
    )
