"""Dropping whole expired partitions: detach each in a short transaction, then drop it on its own.

The parent is locked only for the detach (``schema.partitions.briefly``: a short lock timeout,
tried again); the ``DROP TABLE`` whose commit unlinks the day's files holds only that table. A day
left detached by a run that stopped half-way is dropped by the next one. Each drop is logged with
the time its detach (the parent's lock) and its drop took.

Errors: ``ValueError`` for a retention under one day; ``asyncpg.LockNotAvailableError`` when no
try got the parent's lock (nothing changed); other asyncpg errors pass through.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections.abc import Awaitable, Callable

import asyncpg

from schema.partition_names import ident, partition_name
from schema.partition_ranges import DayRange
from schema.partitions import briefly, existing_days, existing_ranges, partition_key

log = logging.getLogger(__name__)

_DAY = dt.timedelta(days=1)


async def detach_day(conn: asyncpg.Connection, *, parent: str, day: dt.date) -> list[str]:
    """Detach ``day`` of ``parent`` (and delete that day's rows in its default partition, normally
    none), in the caller's transaction; returns the table detached, if there was one, for the
    caller to drop once that transaction is committed. For a table whose days go with another's
    (``drop_expired``'s ``before_drop``)."""
    key = await partition_key(conn, parent=parent)
    await conn.execute(f"DELETE FROM {ident(parent)}_default WHERE {DayRange(day, day + _DAY).within(key)}")
    if day not in await existing_days(conn, parent=parent):
        return []
    name = partition_name(parent, day)
    await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {name}")
    return [name]


async def _detach_with(
    conn: asyncpg.Connection,
    *,
    parent: str,
    name: str,
    day: dt.date,
    before_drop: Callable[[dt.date], Awaitable[list[str]]] | None,
) -> list[str]:
    """Detach ``name`` after ``before_drop``'s tables, in one short transaction; returns every
    table detached, ``name`` last."""

    async def detach() -> list[str]:
        followers = await before_drop(day) if before_drop is not None else []
        await conn.execute(f"ALTER TABLE {parent} DETACH PARTITION {name}")
        return [*followers, name]

    return await briefly(conn, detach)


async def _drop_detached(conn: asyncpg.Connection, names: list[str]) -> None:
    """``DROP TABLE`` each detached day on its own: the commit that unlinks a day's files (0.3 s
    for 0.56 GB, docs/partitioning.md) then holds only that table's lock, never the parent's."""
    for name in names:
        await conn.execute(f"DROP TABLE IF EXISTS {ident(name)}")


async def _orphans(conn: asyncpg.Connection, *, parent: str, cutoff: dt.date) -> list[str]:
    """Day tables of ``parent`` before ``cutoff`` that are detached but still there (a run that
    stopped between its detach and its drop)."""
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
    before_drop: Callable[[dt.date], Awaitable[list[str]]] | None = None,
) -> list[str]:
    """Drop each partition wholly older than ``today - retention_days`` (its last day before it);
    return the names (``before_drop``'s first, partition by partition).

    ``live_filter`` is a SQL condition on the partition's rows (e.g. ``status = ANY(...)`` for
    non-terminal notifications), or a function of the partition's days giving one: a partition holding any such row is kept whole, so a send
    scheduled a month out is never lost; it goes on a later run once its rows are terminal.
    Dropping is ``DETACH`` (with ``before_drop``, which detaches the tables whose days go with
    this one, in one short transaction) then ``DROP`` of each detached table on its own: no
    row-by-row DELETE, no vacuum afterwards, and the parent locked only for the detach. A day
    left detached by an earlier run that stopped half-way is dropped too.
    """
    if retention_days < 1:
        raise ValueError("retention_days must be at least 1")
    cutoff = today - retention_days * _DAY
    dropped: list[str] = []
    for name, days in await existing_ranges(conn, parent=parent):
        if days.end > cutoff:
            break
        live = live_filter(days) if callable(live_filter) else live_filter
        if live is not None and await conn.fetchval(f"SELECT EXISTS (SELECT 1 FROM {name} WHERE {live})"):
            continue
        started = time.perf_counter()
        detached = await _detach_with(conn, parent=parent, name=name, day=days.start, before_drop=before_drop)
        detached_at = time.perf_counter()
        await _drop_detached(conn, detached)
        log.info(
            "dropped %s: detached in %.0f ms, dropped in %.0f ms", ", ".join(detached),
            (detached_at - started) * 1000, (time.perf_counter() - detached_at) * 1000,
        )  # fmt: skip
        dropped += detached
    return dropped + await drop_leftovers(conn, parent=parent, today=today, retention_days=retention_days)


async def drop_leftovers(
    conn: asyncpg.Connection, *, parent: str, today: dt.date, retention_days: int
) -> list[str]:
    """Drop the days of ``parent`` past retention that a stopped run detached but never dropped;
    returns their names. ``drop_expired`` does it for its own table; a table whose days go with
    another's needs it called for it."""
    orphans = await _orphans(conn, parent=parent, cutoff=today - retention_days * _DAY)
    await _drop_detached(conn, orphans)
    return orphans
