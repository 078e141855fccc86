"""Time-ordered identifiers (UUIDv7, RFC 9562): index-friendly and sortable by creation time."""

from __future__ import annotations

import datetime
import os
import time
import uuid


def uuid7() -> uuid.UUID:
    """A UUIDv7: 48-bit millisecond timestamp, then 74 random bits."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
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
