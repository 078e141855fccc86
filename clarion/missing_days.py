"""A day of the log created when a write finds it missing: the safety net a default partition was;
and a write refused because its day was moving out of a default partition, tried once more.

``notifications`` and ``notification_keys`` have no default partition (so that a day can be
detached ``CONCURRENTLY``, ``schema.partition_drops``), so a row whose day has no partition is
refused: "no partition of relation ... found for row" (SQLSTATE 23514). The upkeep creates days a
week ahead (``clarion.log_maintenance``); when it has not (stopped for a week, a clock far off),
the writer's transaction is rolled back whole, :func:`create_missing_day` creates that day for
every log table (as the upkeep would, the accept's tables last: ``clarion.log_maintenance.ensure_days``,
safe under concurrent creators, each waiting at most ``LOCK_TIMEOUT_MS`` per try), and the writer
tries once more.
Each day this process created is counted (``clarion_log_partitions_created_on_demand_total``; a
refusal whose day another writer or the upkeep made first is not: the metric counted every
refusal, so a burst of sends on a missing day read as that many days) and each refusal logged.

A table that keeps a default partition takes a row of a day without its partition there, and
making the day moves the day's rows out (``schema.partitions._create_days``: delete, insert,
attach, under ACCESS EXCLUSIVE on the default). A write that waited for that lock had been routed
into the default before the day was attached, and is refused: "new row for relation "..._default"
violates partition constraint" (SQLSTATE 23514, :func:`moved_out_of_default`). The log's days are
made so that this does not arise for its own tables (``clarion.log_maintenance.MAKE_ORDER``); a day
made late still moves (the upkeep stopped, the webhook tables before ``clarion webhooks`` made
theirs), and :func:`once_more_if_moved` runs such a transaction again: planned after the attach,
it goes to the day.

Errors: :func:`missing_day` returns ``None`` for any other error; :func:`create_missing_day`
passes asyncpg's errors through (``asyncpg.LockNotAvailableError`` when no try got the parent's
lock), and the writer then fails as it would have.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import asyncpg

from clarion import metrics
from clarion.log_maintenance import LOG_TABLES, ensure_days, utc_today

log = logging.getLogger(__name__)

T = TypeVar("T")
_MOVED = re.compile(r'new row for relation "\w+_default" violates partition constraint')
_NO_PARTITION = re.compile(r'no partition of relation "(\w+)" found for row')
_KEY = re.compile(r"Partition key of the failing row contains \(\w+\) = \((.+)\)\.$", re.DOTALL)
# The key as PostgreSQL printed it, read back under the same session's DateStyle and TimeZone (a
# connection of the same pool): a timestamptz names its UTC day, a date is the day.
_DAY_OF = """
SELECT CASE WHEN $1 ~ ':' THEN ($1::timestamptz AT TIME ZONE 'UTC')::date ELSE $1::date END
"""


@dataclass(frozen=True, slots=True)
class MissingDay:
    """A write refused for want of a partition: the table, and its partition key as printed."""

    parent: str
    key_text: str | None  # None when PostgreSQL gave no detail


def missing_day(exc: BaseException) -> MissingDay | None:
    """The missing day ``exc`` reports, if it is the refusal of a log table's row for want of a
    partition."""
    if not isinstance(exc, asyncpg.CheckViolationError):
        return None
    match = _NO_PARTITION.match(str(exc))
    if match is None or match.group(1) not in {t.name for t in LOG_TABLES}:
        return None
    key = _KEY.match(getattr(exc, "detail", None) or "")
    return MissingDay(match.group(1), key.group(1) if key else None)


async def create_missing_day(*, conn: asyncpg.Connection, missing: MissingDay) -> list[str]:
    """Create the partitions of ``missing``'s day for every log table (each with its own span,
    fill factor and no default partition where it has none); returns the names created, none if a
    concurrent writer or the upkeep made them first. ``conn`` outside the failed transaction."""
    day = utc_today() if missing.key_text is None else await conn.fetchval(_DAY_OF, missing.key_text)
    assert isinstance(day, dt.date)
    created = await ensure_days(conn=conn, today=day, days_ahead=0)
    if created:  # a day found made meanwhile is another writer's (it counted it) or the upkeep's
        metrics.LOG_PARTITIONS_ON_DEMAND.labels(missing.parent).inc()
    log.warning(
        "a write to %s found no partition for %s: created %s on demand (is the log's upkeep running?)",
        missing.parent, day, ", ".join(created) or "nothing (made meanwhile)",
    )  # fmt: skip
    return created


def moved_out_of_default(exc: BaseException) -> bool:
    """Whether ``exc`` refused a row routed into a default partition while its day moved out."""
    return isinstance(exc, asyncpg.CheckViolationError) and _MOVED.match(str(exc)) is not None


async def once_more_if_moved(work: Callable[[], Awaitable[T]]) -> T:
    """``work()``, a whole transaction, run once more if a row of it was refused because its day
    moved out of a default partition meanwhile (a day moves out once: the second run goes to it)."""
    try:
        return await work()
    except asyncpg.CheckViolationError as exc:
        if not moved_out_of_default(exc):
            raise
        log.info("a write waited for its day to move out of a default partition; writing it again")
    return await work()
