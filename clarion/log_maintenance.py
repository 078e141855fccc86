"""The notification log's upkeep: days created ahead, expired days dropped whole, its figures.

A missing partition at midnight would send the next day's rows to the default partition of a
table that has one (where they stay safe, but every later day's creation has to move them), and
would make the first send of the day create its day on demand in one that has not
(``clarion.missing_days``); a missing drop lets the log grow without bound. :func:`maintain` does both for every table that grows per send, and is idempotent:
it runs every ``CLARION_MAINTENANCE_INTERVAL_S`` (an hour) in the relay, and as ``clarion
maintain`` for cron; several relays, or a cron job beside them, are harmless. The day is passed
in (``today``), so the tests run the clock past a midnight.

Retention (``CLARION_RETENTION_DAYS``) drops a day once it is wholly older than ``today -
retention_days``, except a day still holding a notification not in a final status (a send
scheduled a month out), whose partition is kept whole until a later run finds it final. The
event-id keys are kept by the week (``KEY_SPAN_DAYS``): a week goes once its last day is past
retention and no notification it names is live, so a key can outlive its notification by up to 6
days but never goes before it (a notification and its key are stamped with the same ``now()``).

The tables the accept writes (``notifications``, ``notification_keys``) have no default partition,
so their days are detached ``CONCURRENTLY``: a send is never queued behind a drop
(``schema.partition_drops``; migration 0016). The others keep theirs and are detached under a short
ACCESS EXCLUSIVE lock: the worker, the webhooks and the rollups write them, not the accept.

A run detaches every expired day first and drops the detached tables after, one at a time, with
``step_pause_s`` (``CLARION_LOG_STEP_PAUSE_S``) between any two of these steps. A day's removal was
five detaches and five drops back to back, ~0.5 s in which the sends in flight were slower (p50 +11
ms, p99 +50 ms, ``bench.drop_blip``, 2026-11-29). Timed step by step, each of them slows the few
sends in flight beside it by some milliseconds (a ``DROP TABLE``'s commit truncates the day's
files, 44 ms in the kernel for a 141 MB day, and the sends' WAL commits wait behind it; a
``CONCURRENTLY`` detach's catalogue work and invalidation); back to back they hit the same sends.
Spaced apart, no send meets two of them; the run takes ~10 pauses longer, once a day
(docs/benchmarks.md, "bench.drop_blip").

The order of one run's steps, and what a stop between two of them leaves:

1. a week of ``notification_keys`` detached (kept while a notification of its days is live): a
   stop after it leaves notifications whose keys are gone, i.e. a repeat accepted again, as
   retention does anyway a day later;
2. a day of ``notifications`` detached ``CONCURRENTLY`` (a stop inside it leaves the day detach
   pending: the next run finishes the detach);
3. the same day of ``engagement`` and of ``analytics_hourly`` (``goes_with_log``) detached, only
   once no partition of ``notifications`` covers it (``detach_followers``): a stop between 2 and 3
   leaves those days with their notifications gone until the next run, never a kept day of
   notifications without its engagement or its counts;
4. ``delivery_attempts`` and ``sandbox_messages`` detached on their own retention (by the
   worker's clock, not the notification's day);
5. every detached day past retention dropped, in the same table order (``detached_leftovers``):
   a stop before or among these drops leaves detached tables no query sees, which the next run
   finds by name and drops (after a crash too: nothing but the catalogue remembers them).

Errors: asyncpg errors pass through; :class:`Maintainer` logs a failed run and tries again at the
next interval.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import asyncpg

from clarion import metrics
from schema.enums import TERMINAL_STATUSES, Status
from schema.partition_drops import detach_expired, detach_followers, detached_leftovers, drop_detached
from schema.partition_ranges import DayRange
from schema.partitions import days_ahead, default_rows, ensure_ahead, existing_days

log = logging.getLogger(__name__)

_LIVE_STATUSES = ", ".join(f"'{s.value}'" for s in Status if s not in TERMINAL_STATUSES)
LIVE_NOTIFICATION = f"status IN ({_LIVE_STATUSES})"
NOTIFICATIONS_FILLFACTOR = 80


@dataclass(frozen=True, slots=True)
class LogTable:
    """A table of the log and the rows that keep a day of it past its retention; a table that
    ``goes_with_log`` loses a day only after ``notifications`` has (its engagement). Without a
    ``default_partition`` a day is detached ``CONCURRENTLY`` and a write finding its day missing
    creates it (``clarion.missing_days``)."""

    name: str
    live_filter: str | Callable[[DayRange], str] | None  # a condition, or one for a partition's days
    goes_with_log: bool = False
    fillfactor: int = 100
    span_days: int = 1  # days per partition (schema/partition_ranges.py)
    default_partition: bool = True


# Each accept probes every kept partition of the event-id keys (api/idempotency.py): with a day
# each, 31 probes per key and a plan over 31 children, and with 3 M notifications over 30 days the
# lookup's share of PostgreSQL's time per notification grew from 56 us to 502 us (plan 161, run
# 342; pg_stat_statements, `bench.growth`'s fill and load, 2026-11-26, docs/partitioning.md). A
# week each: 6 probes for the 30 days (more while an install's daily partitions from before last,
# or a week is kept for a scheduled send), and a key is kept 30 to 37 days after its first use,
# not 30 to 31.
KEY_SPAN_DAYS = 7


def _live_key_week(days: DayRange) -> str:
    """A week of keys is live while a notification created on its days is: a key and its
    notification are stamped with the same ``now()``. It was ``notification_id IN (the live
    notifications)``, a scan of the week's keys: 1.2 s of the upkeep's run for 1.4 M keys while
    the load ran (``bench.drop_blip --rows 6000000``, 2026-11-28); this reads the live rows of
    those days only, by the log's pending index."""
    return f"EXISTS (SELECT 1 FROM notifications WHERE {LIVE_NOTIFICATION} AND {days.within('created_at')})"


# In drop order: the keys first (a week of them goes only once no notification it names is live).
LOG_TABLES = (
    LogTable("notification_keys", _live_key_week, span_days=KEY_SPAN_DAYS, default_partition=False),
    LogTable("engagement", None, goes_with_log=True),
    # Room on each page for the HOT update that records the broker's ack (api/outbox.py); the
    # other tables are written once (docs/partitioning.md, "Fill factor").
    LogTable(
        "notifications", LIVE_NOTIFICATION, fillfactor=NOTIFICATIONS_FILLFACTOR, default_partition=False
    ),
    LogTable("delivery_attempts", None),
    LogTable("sandbox_messages", None),
    # Hourly rollups, by the hour a notification was accepted: a send scheduled a month out is
    # counted when it is recorded, into its day, kept as long as the send is (dropped on their own
    # retention, such a count went to the default partition for good).
    LogTable("analytics_hourly", None, goes_with_log=True),
)


# The order a day is made in: the accept's tables last. No notification of a day exists before its
# day of notifications does, so nothing keyed by one (its engagement and rollups by its day, its
# attempts and sandbox messages by the worker's clock, in it) is written for a day whose partition
# of these tables is still missing: nothing lands in a default that making the day would move out
# under its writers, who were refused (SQLSTATE 23514: the default's constraint changed under them).
MAKE_ORDER = tuple(sorted(LOG_TABLES, key=lambda table: not table.default_partition))


async def ensure_days(*, conn: asyncpg.Connection, today: dt.date, days_ahead: int) -> list[str]:
    """Create today .. today + ``days_ahead`` for every log table, in ``MAKE_ORDER`` (each with its
    span, fill factor and default partition or none); returns the names created."""
    created: list[str] = []
    for table in MAKE_ORDER:
        created += await ensure_ahead(
            conn, parent=table.name, today=today, days_ahead=days_ahead, fillfactor=table.fillfactor,
            span_days=table.span_days, default_partition=table.default_partition,
        )  # fmt: skip
    return created


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    """What one run did, and the gauges' figures after it (per table; ``default_rows`` for the
    tables that have a default partition); ``longest_work_s`` is the longest stretch of the run
    between two pauses (the run itself takes the pauses longer)."""

    created: list[str]
    dropped: list[str]
    days_ahead: dict[str, int]
    default_rows: dict[str, int]
    longest_work_s: float = 0.0


class _Pace:
    """Awaited before each detach and each drop: pauses ``pause_s`` (none before the first), and
    times the stretches of work between the pauses."""

    def __init__(self, pause_s: float, sleep: Callable[[float], Awaitable[None]]) -> None:
        self.pause_s, self.sleep = pause_s, sleep
        self.steps, self.longest_s, self.since = 0, 0.0, time.perf_counter()

    async def __call__(self) -> None:
        if self.steps and self.pause_s > 0:
            self.lap()
            await self.sleep(self.pause_s)
            self.since = time.perf_counter()
        self.steps += 1

    def lap(self) -> float:
        self.longest_s = max(self.longest_s, time.perf_counter() - self.since)
        return self.longest_s


def utc_today(now: dt.datetime | None = None) -> dt.date:
    """The UTC day of ``now`` (the partitions are UTC days)."""
    return (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).date()


async def maintain(
    *,
    conn: asyncpg.Connection,
    today: dt.date,
    retention_days: int,
    partitions_ahead: int,
    step_pause_s: float = 0.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> MaintenanceReport:
    """Create today .. today + ``partitions_ahead`` for every log table, detach the expired days,
    drop the detached ones, ``sleep(step_pause_s)`` between any two detaches or drops (module
    docstring), and set the ``clarion_log_*`` gauges. Idempotent. ``conn`` must not be in a
    transaction (a ``CONCURRENTLY`` detach cannot run in one)."""
    pace = _Pace(step_pause_s, sleep)
    created = await ensure_days(conn=conn, today=today, days_ahead=partitions_ahead)
    dropped: list[str] = []
    ahead: dict[str, int] = {}
    stray: dict[str, int] = {}
    order: list[str] = []  # the module docstring's: a follower right after its leader
    for table in LOG_TABLES:
        if table.goes_with_log:
            continue
        order.append(table.name)
        await detach_expired(
            conn, parent=table.name, today=today, retention_days=retention_days,
            live_filter=table.live_filter, pause=pace,
        )  # fmt: skip
        if table.name == "notifications":
            for follower in (t for t in LOG_TABLES if t.goes_with_log):
                order.append(follower.name)
                await detach_followers(
                    conn, parent=follower.name, leader=table.name, today=today,
                    retention_days=retention_days, pause=pace,
                )  # fmt: skip
    for name in order:  # this run's detaches, and any a stopped run left
        for leftover in await detached_leftovers(
            conn, parent=name, today=today, retention_days=retention_days
        ):
            await pace()
            dropped.append(await drop_detached(conn, name=leftover))
    longest_work_s = pace.lap()
    for table in LOG_TABLES:
        ahead[table.name] = await days_ahead(conn, parent=table.name, today=today)
        metrics.LOG_PARTITIONS_AHEAD.labels(table.name).set(ahead[table.name])
        if table.default_partition:  # the others have none: a missing day is made on demand
            stray[table.name] = await default_rows(conn, parent=table.name)
            metrics.LOG_DEFAULT_ROWS.labels(table.name).set(stray[table.name])
    metrics.LOG_MAINTENANCE_RUN.set(time.time())
    if created or dropped:
        log.info("log maintenance: created %s, dropped %s", created or "none", dropped or "none")
    return MaintenanceReport(created, dropped, ahead, stray, longest_work_s)


@dataclass(frozen=True, slots=True)
class LogSize:
    """How big the log is and how far back it reaches (``clarion status``, ``/v1/ops``)."""

    total_bytes: int
    oldest_day: dt.date | None
    days_kept: int
    partitions_ahead: int
    default_rows: int


_SIZE = """
SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)
  FROM unnest($1::text[]) AS p(name), pg_partition_tree(p.name::regclass) t
"""


async def log_size(*, conn: asyncpg.Connection, today: dt.date) -> LogSize:
    """Bytes of every log table (indexes included), the oldest day of notifications kept, and the
    least days ahead and the most default-partition rows over the tables that have one."""
    total = await conn.fetchval(_SIZE, [t.name for t in LOG_TABLES])
    days = [d for d in await existing_days(conn, parent="notifications") if d <= today]
    ahead = [await days_ahead(conn, parent=t.name, today=today) for t in LOG_TABLES]
    stray = [await default_rows(conn, parent=t.name) for t in LOG_TABLES if t.default_partition]
    return LogSize(int(total), days[0] if days else None, len(days), min(ahead), max(stray, default=0))


class Maintainer:
    """Runs :func:`maintain` every ``interval_s`` on a connection of its own (opened per run),
    ``step_pause_s`` between its detaches and drops."""

    def __init__(
        self,
        dsn: str,
        *,
        retention_days: int,
        partitions_ahead: int,
        interval_s: float,
        step_pause_s: float = 0.0,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
    ) -> None:
        self.step_pause_s = step_pause_s
        self.dsn = dsn
        self.retention_days = retention_days
        self.partitions_ahead = partitions_ahead
        self.interval_s = interval_s
        self.clock = clock

    async def run_once(self) -> MaintenanceReport:
        conn = await asyncpg.connect(self.dsn)
        try:
            return await maintain(
                conn=conn,
                today=utc_today(self.clock()),
                retention_days=self.retention_days,
                partitions_ahead=self.partitions_ahead,
                step_pause_s=self.step_pause_s,
            )
        finally:
            await conn.close()

    async def run(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception:
                log.warning("log maintenance failed; retrying in %.0fs", self.interval_s, exc_info=True)
            await asyncio.sleep(self.interval_s)
