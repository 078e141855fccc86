"""Range partitions by day: create them ahead, count the days ahead (dropping: ``schema.partition_drops``).

Clarion's own small loop rather than pg_partman: a few statements per table and day, testable with
an injected clock, no extension to install on managed PostgreSQL. A parent table is range
partitioned on a ``timestamptz`` (or ``date``) column; each child holds one UTC day, or a span of
days (``span_days``, ``schema.partition_ranges``), and is named ``<parent>_pYYYYMMDD`` after its
first day. A table may have a ``<parent>_default`` partition, the safety net that a row never fails
for want of a partition (``default_rows`` reports whether anything landed there); the tables the
accept writes have none, so that a day can be detached ``CONCURRENTLY`` (``schema.partition_drops``),
and a missing day is created when a write needs it (``clarion.missing_days``).

Errors: identifiers are never tenant input; ``ValueError`` for a name that is not a plain SQL
identifier, asyncpg errors pass through unchanged.

Wired in by ``clarion.log_maintenance`` for every table of the log (docs/partitioning.md).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import re
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TypeVar

import asyncpg

from schema.partition_names import ident, partition_name
from schema.partition_ranges import DayRange, free_range

log = logging.getLogger(__name__)

_DAY = dt.timedelta(days=1)


# A partition's bounds as UTC days, 'YYYY-MM-DD'. pg_get_expr prints them in the session's DateStyle
# and TimeZone; cast back under the same settings they are exact again, and to_char prints them the
# one way. A bound with a time of day is a timestamptz (its instant's UTC day); one without, a date.
# MINVALUE, MAXVALUE and DEFAULT do not match the pattern: NULL.
_RANGES = """
SELECT c.relname,
       CASE WHEN b[1] ~ ':' THEN to_char(b[1]::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')
            ELSE to_char(b[1]::date, 'YYYY-MM-DD') END AS lo,
       CASE WHEN b[2] ~ ':' THEN to_char(b[2]::timestamptz AT TIME ZONE 'UTC', 'YYYY-MM-DD')
            ELSE to_char(b[2]::date, 'YYYY-MM-DD') END AS hi
  FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_class p ON p.oid = i.inhparent,
       regexp_match(pg_get_expr(c.relpartbound, c.oid), '^FOR VALUES FROM \\(''([^'']*)''\\) TO \\(''([^'']*)''\\)$') AS b
 WHERE p.relname = $1 AND NOT i.inhdetachpending
"""


async def existing_ranges(conn: asyncpg.Connection, *, parent: str) -> list[tuple[str, DayRange]]:
    """Each of Clarion's partitions of ``parent`` (named ``<parent>_pYYYYMMDD`` after its first day)
    and its days, oldest first. The default partition, and any partition of another name or whose
    bounds are not whole days (an operator's own, say), are left out: never created over, never
    dropped. So is one whose ``DETACH ... CONCURRENTLY`` was interrupted (detach pending: no new
    query sees it; ``schema.partition_drops`` finishes it)."""
    ranges = []
    for row in await conn.fetch(_RANGES, ident(parent)):
        try:
            days = DayRange(dt.date.fromisoformat(row["lo"]), dt.date.fromisoformat(row["hi"]))
        except (TypeError, ValueError):  # NULL (MINVALUE...), 'infinity', less than a day
            continue
        if row["relname"] == partition_name(parent, days.start):
            ranges.append((row["relname"], days))
    return sorted(ranges, key=lambda named: named[1])


async def existing_days(conn: asyncpg.Connection, *, parent: str) -> list[dt.date]:
    """The first day of each partition, oldest first (every day of a table of daily partitions)."""
    return [days.start for _, days in await existing_ranges(conn, parent=parent)]


# Detaching a day of a table with a default partition takes ACCESS EXCLUSIVE on the parent, creating
# one on the default partition: waiting behind a long reader (a search, an export) would queue every
# query behind it, so the upkeep gives up after this long (below deadlock_timeout, 1 s), lets them
# through, and tries again (docs/partitioning.md). A CONCURRENTLY detach waits as long for the
# transactions already in the parent before it gives up (and is finished on the next try).
LOCK_TIMEOUT_MS = 200
LOCK_TRIES = 10
LOCK_PAUSE_S = 0.5
T = TypeVar("T")


async def briefly(conn: asyncpg.Connection, work: Callable[[], Awaitable[T]]) -> T:
    """``work`` in a transaction (a savepoint inside the caller's) that waits at most
    ``LOCK_TIMEOUT_MS`` for a lock, tried ``LOCK_TRIES`` times; raises
    ``asyncpg.LockNotAvailableError`` when no try got its locks, having changed nothing."""

    async def once() -> T:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
            done = await work()
            await conn.execute("SET LOCAL lock_timeout = DEFAULT")  # not for the caller's rest
        return done

    return await _tried(once)


async def briefly_alone(conn: asyncpg.Connection, work: Callable[[], Awaitable[T]]) -> T:
    """``work`` outside any transaction (for ``DETACH PARTITION ... CONCURRENTLY``, which PostgreSQL
    refuses inside one), its session's ``lock_timeout`` at ``LOCK_TIMEOUT_MS``, tried ``LOCK_TRIES``
    times as :func:`briefly` does; ``work`` must be safe to run again after a timeout left it half
    done. Raises ``asyncpg.LockNotAvailableError`` when no try got its locks."""
    if conn.is_in_transaction():
        raise RuntimeError("briefly_alone needs a connection outside any transaction")

    async def once() -> T:
        await conn.execute(f"SET lock_timeout = {LOCK_TIMEOUT_MS}")
        try:
            return await work()
        finally:
            await conn.execute("RESET lock_timeout")

    return await _tried(once)


async def _tried(once: Callable[[], Awaitable[T]]) -> T:
    """``once`` tried ``LOCK_TRIES`` times, ``LOCK_PAUSE_S`` apart, while it fails for want of a lock."""
    started = time.perf_counter()
    for attempt in range(LOCK_TRIES):
        try:
            done = await once()
        except asyncpg.LockNotAvailableError:
            if attempt == LOCK_TRIES - 1:
                raise
            await asyncio.sleep(LOCK_PAUSE_S)
            continue
        if attempt:
            log.info(
                "partition change done on try %d of %d, %.0f ms after the first",
                attempt + 1, LOCK_TRIES, (time.perf_counter() - started) * 1000,
            )  # fmt: skip
        return done
    raise AssertionError("unreachable")


async def ensure_ahead(
    conn: asyncpg.Connection,
    *,
    parent: str,
    today: dt.date,
    days_ahead: int,
    fillfactor: int = 100,
    span_days: int = 1,
    default_partition: bool = False,
) -> list[str]:
    """Create partitions covering every day from ``today`` to ``today + days_ahead``, one per
    ``span_days`` (``partition_ranges.free_range``), each with ``fillfactor`` (below 100 leaves room
    on a page for HOT updates), and the default partition if ``default_partition`` and it is
    missing (the migrations make the defaults of the tables that have one; the accept's tables
    have none: ``clarion.log_maintenance.LogTable.default_partition``).

    Idempotent; returns the names it created. Safe to run from several processes: each day is
    created under the parent's SHARE UPDATE EXCLUSIVE lock, and a loser finds it there.
    """
    created: list[str] = []
    taken = [days for _, days in await existing_ranges(conn, parent=parent)]
    if not 10 <= fillfactor <= 100:
        raise ValueError(f"fillfactor must be 10..100, not {fillfactor}")
    storage = f"WITH (fillfactor = {fillfactor})"
    if default_partition:
        await conn.execute(
            f"CREATE TABLE IF NOT EXISTS {ident(parent)}_default PARTITION OF {parent} DEFAULT {storage}"
        )
    for offset in range(days_ahead + 1):
        day = today + offset * _DAY
        if any(days.covers(day) for days in taken):
            continue
        days = free_range(day, span_days=span_days, taken=taken)
        name = partition_name(parent, days.start)
        await briefly(conn, partial(_create_days, conn, parent=parent, name=name, days=days, storage=storage))
        taken.append(days)
        created.append(name)
    return created


async def _create_days(
    conn: asyncpg.Connection, *, parent: str, name: str, days: DayRange, storage: str
) -> None:
    """Create the partition ``name`` of ``parent`` for ``days`` as a plain table and attach it,
    moving their rows out of the default partition first if any landed there.

    ``CREATE TABLE ... PARTITION OF`` would take ACCESS EXCLUSIVE on the parent: every send, claim
    and read of the log waits behind it, and the parent's lock waits for every transaction already
    in it (checked on PostgreSQL 15, ``tests/schema/test_retention_locks.py``). ``ATTACH PARTITION``
    takes SHARE UPDATE EXCLUSIVE on the parent, which no insert, update or read conflicts with,
    and ACCESS EXCLUSIVE on the default partition only, which a query pruned to its days never
    opens. Taken first, the parent's lock also makes concurrent upkeeps create a day one at a time.
    """
    await conn.execute(f"LOCK TABLE {parent} IN SHARE UPDATE EXCLUSIVE MODE")
    if await conn.fetchval(
        "SELECT relispartition FROM pg_class WHERE oid = to_regclass($1)", name
    ):  # another process's upkeep made it since this one looked
        return
    key = await partition_key(conn, parent=parent)
    within = days.within(key)
    await conn.execute(
        f"CREATE TABLE IF NOT EXISTS {name} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) {storage}"
    )
    # PostgreSQL refuses a partition while the default holds rows of its range ("updated partition
    # constraint for default partition would be violated"): those rows move into it first.
    if await has_default(conn, parent=parent) and await conn.fetchval(
        f"SELECT EXISTS (SELECT 1 FROM {parent}_default WHERE {within})"
    ):
        await conn.execute(
            f"WITH moved AS (DELETE FROM {parent}_default WHERE {within} RETURNING *) "
            f"INSERT INTO {name} SELECT * FROM moved"
        )
    await conn.execute(f"ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES {days.bounds()}")


async def partition_key(conn: asyncpg.Connection, *, parent: str) -> str:
    """The column a parent is range partitioned on, from ``pg_get_partkeydef``."""
    definition = await conn.fetchval(
        "SELECT pg_get_partkeydef(c.oid) FROM pg_class c WHERE c.relname = $1", parent
    )
    match = re.fullmatch(r"RANGE \((\w+)\)", definition or "")
    if match is None:
        raise ValueError(f"{parent} is not range partitioned on one column: {definition!r}")
    return ident(match.group(1))


async def days_ahead(conn: asyncpg.Connection, *, parent: str, today: dt.date) -> int:
    """How many whole days after ``today`` already have a partition, counted without a gap.

    The figure behind the "partitions running out" gauge: 0 means tomorrow's sends would land in
    the default partition.
    """
    have = {day for _, days in await existing_ranges(conn, parent=parent) for day in days.days()}
    ahead = 0
    while today + (ahead + 1) * _DAY in have:
        ahead += 1
    return ahead


async def has_default(conn: asyncpg.Connection, *, parent: str) -> bool:
    """Whether ``parent`` has its ``<parent>_default`` partition."""
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table t JOIN pg_class p ON p.oid = t.partrelid"
            " WHERE p.relname = $1 AND t.partdefid <> 0)",
            ident(parent),
        )
    )


async def default_rows(conn: asyncpg.Connection, *, parent: str) -> int:
    """Rows in the default partition: anything above 0 means a day was missing when it arrived.
    0 for a table without one (a missing day is created on demand there: nothing lands aside)."""
    if not await has_default(conn, parent=parent):
        return 0
    value = await conn.fetchval(f"SELECT count(*) FROM {ident(parent)}_default")
    return int(value)
