"""Dropping whole expired partitions: detach each, then drop it on its own.

The two are separate steps (:func:`detach_expired`, :func:`detach_followers`; then
:func:`drop_leftovers` or :func:`drop_detached`) so that a caller can space them apart: the
sends in flight beside each step are slowed a little (a ``DROP``'s commit truncates the day's files
and the sends' commits wait behind it), so ``clarion.log_maintenance`` detaches every expired day
first and then drops them one at a time, with a pause between any two steps. :func:`drop_expired`
does both back to back, for a caller that needs no pacing (the webhook deliveries' retention).

A table without a default partition (the ones the accept writes) is detached ``CONCURRENTLY``: the
parent is held only in SHARE UPDATE EXCLUSIVE, which no insert, update or read conflicts with, so
sends are neither queued behind the detach nor waited for while it holds the parent; PostgreSQL
waits for the transactions already in the parent between its two steps. A table with a default
partition (PostgreSQL refuses ``CONCURRENTLY`` there) is detached in a short transaction that takes
the parent's ACCESS EXCLUSIVE lock (``schema.partitions.briefly``: a short lock timeout, tried
again). Either way the ``DROP TABLE`` whose commit unlinks the day's files holds only that table.

What a stopped run leaves, and who finishes it:

- a ``CONCURRENTLY`` detach interrupted between its two steps (a lock timeout while it waited for
  the transactions in the parent, a cancel, a crash) leaves the day *detach pending*
  (``pg_inherits.inhdetachpending``): no new query sees it, no row can go in, and nothing can be
  created over it. The next run's :func:`drop_expired` finishes it (``DETACH PARTITION ...
  FINALIZE``) and drops it; it was chosen to go, and a pending day cannot be taken back.
- a day detached but not dropped is dropped by the next run (:func:`drop_leftovers`).
- a table whose days go with another's (``engagement`` with ``notifications``:
  :func:`detach_followers`) is detached only *after* its leader's day is: a follower's day goes once
  no partition of the leader covers it, so a stop between the two leaves the leader's day gone and
  the follower's still there (and found by the next run), never the other way round.

Each detach (the parent's lock) and each drop is logged with the time it took.

Errors: ``ValueError`` for a retention under one day; ``asyncpg.LockNotAvailableError`` when no
try got the parent's lock (a table with a default: nothing changed; ``CONCURRENTLY``: the day may be
left pending, for the next run); other asyncpg errors pass through.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections.abc import Awaitable, Callable
from functools import partial

import asyncpg

from schema.partition_names import ident, partition_name
from schema.partition_ranges import DayRange
from schema.partitions import (
    briefly,
    briefly_alone,
    existing_days,
    existing_ranges,
    has_default,
    partition_key,
)

log = logging.getLogger(__name__)

_DAY = dt.timedelta(days=1)
Pause = Callable[[], Awaitable[None]]  # awaited before each detach: the upkeep's pacing


async def _no_pause() -> None:
    return None


async def detach_day(conn: asyncpg.Connection, *, parent: str, day: dt.date) -> list[str]:
    """Detach ``day`` of ``parent`` (and delete that day's rows in its default partition, normally
    none), in the caller's transaction; returns the table detached, if there was one, for the
    caller to drop once that transaction is committed. For a table whose days go with another's
    (:func:`detach_followers`)."""
    key = await partition_key(conn, parent=parent)
    if await has_default(conn, parent=parent):
        await conn.execute(
            f"DELETE FROM {ident(parent)}_default WHERE {DayRange(day, day + _DAY).within(key)}"
        )
    if day not in await existing_days(conn, parent=parent):
        return []
    name = partition_name(parent, day)
    await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {name}")
    return [name]


async def _detach(conn: asyncpg.Connection, *, parent: str, name: str) -> None:
    """Detach ``name`` from ``parent``: ``CONCURRENTLY`` when the parent has no default partition
    (finishing a pending detach with ``FINALIZE``), in a short transaction otherwise."""
    if await has_default(conn, parent=parent):

        async def locked() -> None:
            await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {name}")

        await briefly(conn, locked)
        return

    async def concurrently() -> None:
        pending = await conn.fetchval(_PENDING_OF, name)
        if pending is None:  # detached already (another upkeep)
            return
        # A try that timed out in its second step left the day pending: the next one finishes it.
        how = "FINALIZE" if pending else "CONCURRENTLY"
        await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {name} {how}")

    await briefly_alone(conn, concurrently)


_PENDING_OF = "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass($1)"
_PENDING = """
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
 WHERE i.inhparent = to_regclass($1) AND i.inhdetachpending ORDER BY c.relname
"""


async def pending_detaches(conn: asyncpg.Connection, *, parent: str) -> list[str]:
    """Partitions of ``parent`` left *detach pending* by an interrupted ``CONCURRENTLY``."""
    return [r["relname"] for r in await conn.fetch(_PENDING, ident(parent))]


async def _drop_detached(conn: asyncpg.Connection, names: list[str]) -> None:
    """``DROP TABLE`` each detached day on its own: the commit that unlinks a day's files (0.3 s
    for 0.56 GB, docs/partitioning.md) then holds only that table's lock, never the parent's."""
    for name in names:
        await drop_detached(conn, name=name)


async def drop_detached(conn: asyncpg.Connection, *, name: str) -> str:
    """``DROP TABLE`` one detached day, logged with the time it took; returns its name. The cost is
    the unlink: the kernel truncates the day's files at the commit (44 ms in ``truncate`` for a
    141 MB day, strace, 2026-11-29), and the WAL commits of the sends wait behind it."""
    started = time.perf_counter()
    await conn.execute(f"DROP TABLE IF EXISTS {ident(name)}")
    log.info("dropped %s in %.0f ms", name, (time.perf_counter() - started) * 1000)
    return name


async def detached_leftovers(
    conn: asyncpg.Connection, *, parent: str, today: dt.date, retention_days: int
) -> list[str]:
    """Day tables of ``parent`` past retention that are detached but still there: detached by
    :func:`detach_expired` or :func:`detach_followers` for a later drop, or by a run that stopped
    between its detach and its drop. Oldest first."""
    return await _orphans(conn, parent=parent, cutoff=today - retention_days * _DAY)


async def _orphans(conn: asyncpg.Connection, *, parent: str, cutoff: dt.date) -> list[str]:
    """Day tables of ``parent`` before ``cutoff`` that are detached but still there."""
    rows = await conn.fetch(
        "SELECT relname FROM pg_class WHERE relname LIKE $1 AND relkind = 'r' AND NOT relispartition"
        " AND relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = $2::regclass)",
        f"{ident(parent)}\\_p%",
        parent,
    )
    prefix = f"{parent}_p"
    return sorted(
        r["relname"]
        for r in rows
        if re.fullmatch(r"\d{8}", r["relname"][len(prefix) :])
        and dt.datetime.strptime(r["relname"][len(prefix) :], "%Y%m%d").date() < cutoff
    )


async def drop_expired(
    conn: asyncpg.Connection,
    *,
    parent: str,
    today: dt.date,
    retention_days: int,
    live_filter: str | Callable[[DayRange], str] | None = None,
) -> list[str]:
    """:func:`detach_expired`, then the ``DROP`` of every detached day past retention
    (:func:`drop_leftovers`), back to back; returns the names dropped."""
    await detach_expired(
        conn, parent=parent, today=today, retention_days=retention_days, live_filter=live_filter
    )
    return await drop_leftovers(conn, parent=parent, today=today, retention_days=retention_days)


async def detach_expired(
    conn: asyncpg.Connection,
    *,
    parent: str,
    today: dt.date,
    retention_days: int,
    live_filter: str | Callable[[DayRange], str] | None = None,
    pause: Pause = _no_pause,
) -> list[str]:
    """Detach each partition wholly older than ``today - retention_days`` (its last day before it);
    return the names.

    ``live_filter`` is a SQL condition on the partition's rows (e.g. ``status = ANY(...)`` for
    non-terminal notifications), or a function of the partition's days giving one: a partition
    holding any such row is kept whole, so a send scheduled a month out is never lost; it goes on a
    later run once its rows are terminal. A day left detach pending by an earlier run is finished
    too. The detached tables are left for :func:`drop_leftovers` (or :func:`drop_detached`): no
    row-by-row DELETE, no vacuum afterwards. ``pause`` is awaited before each detach (the upkeep
    spreads its steps apart). Without a default partition the caller must not hold a transaction
    open (``CONCURRENTLY``).
    """
    if retention_days < 1:
        raise ValueError("retention_days must be at least 1")
    cutoff = today - retention_days * _DAY
    detached: list[str] = []
    for name in await pending_detaches(conn, parent=parent):
        await pause()
        detached.append(await _timed_detach(conn, parent=parent, name=name))
    for name, days in await existing_ranges(conn, parent=parent):
        if days.end > cutoff:
            break
        live = live_filter(days) if callable(live_filter) else live_filter
        if live is not None and await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {name} WHERE {live})"):
            continue
        await pause()
        detached.append(await _timed_detach(conn, parent=parent, name=name))
    return detached


async def _timed_detach(conn: asyncpg.Connection, *, parent: str, name: str) -> str:
    started = time.perf_counter()
    await _detach(conn, parent=parent, name=name)
    log.info("detached %s in %.0f ms", name, (time.perf_counter() - started) * 1000)
    return name


async def detach_followers(
    conn: asyncpg.Connection,
    *,
    parent: str,
    leader: str,
    today: dt.date,
    retention_days: int,
    pause: Pause = _no_pause,
) -> list[str]:
    """Detach each day of ``parent`` past retention that no partition of ``leader`` covers any more
    (run after the leader's :func:`detach_expired`): a day of ``parent`` goes after its leader's
    day, never before it, and one the leader keeps (a live send) is kept too. ``pause`` is awaited
    before each detach. Returns the names detached, for :func:`drop_leftovers`."""
    cutoff = today - retention_days * _DAY
    kept = {day for _, days in await existing_ranges(conn, parent=leader) for day in days.days()}
    detached: list[str] = []
    for _, days in await existing_ranges(conn, parent=parent):
        if days.end > cutoff:
            break
        if any(day in kept for day in days.days()):
            continue
        await pause()
        started = time.perf_counter()
        done = await briefly(conn, partial(detach_day, conn, parent=parent, day=days.start))
        log.info(
            "detached %s after %s's day in %.0f ms", ", ".join(done) or "nothing", leader,
            (time.perf_counter() - started) * 1000,
        )  # fmt: skip
        detached += done
    return detached


async def drop_leftovers(
    conn: asyncpg.Connection, *, parent: str, today: dt.date, retention_days: int
) -> list[str]:
    """Drop the days of ``parent`` past retention that a stopped run detached but never dropped;
    returns their names. ``drop_expired`` does it for its own table; a table whose days go with
    another's needs it called for it."""
    orphans = await _orphans(conn, parent=parent, cutoff=today - retention_days * _DAY)
    await _drop_detached(conn, orphans)
    return orphans
