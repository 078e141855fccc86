"""Time-ordered identifiers (UUIDv7, RFC 9562): index-friendly and sortable by creation time."""

from __future__ import annotations

import datetime
import os
import threading
import time
import uuid
from collections.abc import Iterable

# Random bytes drawn 4 KiB at a time: one getrandom() system call per id was 8% of a worker's
# samples in py-spy under `bench.e2e` (2026-11-25; a system call costs ~20 us on this VM). The lock
# keeps two threads from ever taking the same bytes.
_POOL_BYTES = 4096
_pool = b""
_at = 0
_lock = threading.Lock()


def _forget_pool() -> None:
    """A forked child must not hand out the bytes its parent still holds (the same ids twice)."""
    global _pool, _at
    _pool, _at = b"", 0


os.register_at_fork(after_in_child=_forget_pool)


def _random10() -> bytes:
    global _pool, _at
    with _lock:
        if _at + 10 > len(_pool):
            _pool, _at = os.urandom(_POOL_BYTES), 0
        chunk = _pool[_at : _at + 10]
        _at += 10
        return chunk


def uuid7() -> uuid.UUID:
    """A UUIDv7: 48-bit millisecond timestamp, then 74 random bits."""
    return _uuid7(time.time_ns() // 1_000_000)


def uuid7_at(when: datetime.datetime) -> uuid.UUID:
    """A UUIDv7 carrying ``when`` (rows made for an earlier day: migrations, tests, benchmarks)."""
    return _uuid7(int(when.timestamp() * 1000))


def _uuid7(ms: int) -> uuid.UUID:
    rand = int.from_bytes(_random10(), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


def uuid7_time(value: uuid.UUID) -> datetime.datetime:
    """The creation time a UUIDv7 carries (its first 48 bits, ms since the epoch), in UTC.

    Lets a lookup by id alone name the partitions to search: see docs/partitioning.md (by id over
    30 daily partitions 0.87 ms, with the window from this time 0.28 ms).
    Errors: ``ValueError`` for a UUID of another version (its leading bits are not a time).
    """
    if value.version != 7:
        raise ValueError(f"not a UUIDv7: {value}")
    ms = value.int >> 80
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


# The log's ``created_at`` comes from the database's clock at the transaction's start, the id's
# time from the API's clock just before: a day either side covers any skew between them.
_SLACK = datetime.timedelta(days=1)
_EARLIEST = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_LATEST = datetime.datetime(9999, 1, 1, tzinfo=datetime.UTC)
_LATEST_MS = int(_LATEST.timestamp() * 1000)


def created_window(ids: Iterable[uuid.UUID]) -> tuple[datetime.datetime, datetime.datetime]:
    """``(from, to)``: a ``created_at`` range that holds the rows of ``ids``, for a lookup by id to
    add (``created_at BETWEEN from AND to``) so the planner searches only those days' partitions.

    An id that is not a UUIDv7, or one whose time is past year 9999 (never one of Clarion's, but a
    caller may send any UUID), widens the window to every day, so the lookup stays correct (and
    finds nothing)."""
    times = []
    for value in ids:
        if value.version != 7 or value.int >> 80 >= _LATEST_MS:
            return _EARLIEST, _LATEST  # a time past year 9999 is no datetime: a forged id
        times.append(uuid7_time(value))
    if not times:
        return _EARLIEST, _EARLIEST
    return min(times) - _SLACK, max(times) + _SLACK
