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


def _random(size: int) -> bytes:
    global _pool, _at
    with _lock:
        if _at + size > len(_pool):
            _pool, _at = os.urandom(max(_POOL_BYTES, size)), 0
        chunk = _pool[_at : _at + size]
        _at += size
        return chunk


def uuid7() -> uuid.UUID:
    """A UUIDv7: 48-bit millisecond timestamp, then 74 random bits."""
    return _uuid7(time.time_ns() // 1_000_000)


def uuid7_at(when: datetime.datetime) -> uuid.UUID:
    """A UUIDv7 carrying ``when`` (rows made for an earlier day: migrations, tests, benchmarks)."""
    return _uuid7(int(when.timestamp() * 1000))


def _uuid7(ms: int) -> uuid.UUID:
    rand = int.from_bytes(_random(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return uuid.UUID(int=value)


# Each byte's version nibble (7) or variant bits (0b10) over its random bits, for ``bytes.translate``.
_VERSION = bytes(0x70 | (b & 0x0F) for b in range(256))
_VARIANT = bytes(0x80 | (b & 0x3F) for b in range(256))


def uuid7_texts(count: int) -> list[str]:
    """``count`` UUIDv7s of this millisecond as 32 hex digits (what a ``uuid[]`` parameter takes).

    Built a batch at a time, each step one C call over all of them: 500 ids took 1.65 ms as
    ``uuid7()`` each, 0.13 ms so; its 16 steps cost ~10 us, so two ids or fewer are made one by one
    (5 us for one id; timeit, 2026-11-29). For the webhook events of a batch of outcomes or
    engagement reports (``core.webhook_events``)."""
    if count < 3:
        return [uuid7().hex for _ in range(count)]
    ms = (time.time_ns() // 1_000_000 & ((1 << 48) - 1)).to_bytes(6, "big")
    raw = bytearray((ms + bytes(10)) * count)
    rand = _random(10 * count)
    for i in range(10):
        raw[6 + i :: 16] = rand[i::10]
    raw[6::16] = raw[6::16].translate(_VERSION)
    raw[8::16] = raw[8::16].translate(_VARIANT)
    text = raw.hex()
    return [text[i : i + 32] for i in range(0, 32 * count, 32)]


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
