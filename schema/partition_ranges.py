"""The days a partition covers: one day for most of the log's tables, a span of several for a
table that is read across all of its partitions at once.

``notification_keys`` is that table: every accept probes each kept partition of it for the event
ids it was sent (no unique index spans partitions), so 31 daily partitions cost 31 probes per key
and a plan over 31 children per lookup. Wider partitions cost fewer (``clarion.log_maintenance``
sets the span and says what it measured). A span starts on a day that is a multiple of the span
from a Monday (0001-01-01 was one), so a week is a Monday-to-Sunday week, whatever the process's
clock or the day the partitions were first made.

An install whose days already have partitions of another width (a daily one made before the span
grew, a test's single day) keeps them: the new partition is the span clipped to the days no
partition covers yet (:func:`free_range`), and as retention drops the old ones the table settles
into whole spans. Nothing here touches the database.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

_DAY = dt.timedelta(days=1)


@dataclass(frozen=True, slots=True, order=True)
class DayRange:
    """The UTC days ``start`` .. ``end - 1`` (``end`` excluded, as a partition's upper bound)."""

    start: dt.date
    end: dt.date

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValueError(f"an empty range of days: {self.start} .. {self.end}")

    def covers(self, day: dt.date) -> bool:
        return self.start <= day < self.end

    def days(self) -> Iterator[dt.date]:
        day = self.start
        while day < self.end:
            yield day
            day += _DAY

    def bounds(self) -> str:
        """The ``FOR VALUES`` clause of a partition over these days (a ``timestamptz`` or ``date``
        partition key alike: the literal casts to either)."""
        return f"FROM ('{_first_instant(self.start)}') TO ('{_first_instant(self.end)}')"

    def within(self, key: str) -> str:
        """A SQL condition: the column ``key`` (a trusted identifier) falls on these days."""
        return f"{key} >= '{_first_instant(self.start)}' AND {key} < '{_first_instant(self.end)}'"


def _first_instant(day: dt.date) -> str:
    return f"{day.isoformat()} 00:00:00+00"


def span_start(day: dt.date, span_days: int) -> dt.date:
    """The first day of the span of ``span_days`` that holds ``day`` (a Monday for a week)."""
    if span_days < 1:
        raise ValueError(f"span_days must be at least 1, not {span_days}")
    ordinal = day.toordinal()
    return dt.date.fromordinal(ordinal - (ordinal - 1) % span_days)


def free_range(day: dt.date, *, span_days: int, taken: Sequence[DayRange]) -> DayRange:
    """The partition to make for ``day``, which no range in ``taken`` covers: the span holding it,
    less the days the ranges beside it already cover."""
    if any(r.covers(day) for r in taken):
        raise ValueError(f"{day} already has a partition")
    start = span_start(day, span_days)
    end = start + span_days * _DAY
    start = max([start, *(r.end for r in taken if r.end <= day)])
    end = min([end, *(r.start for r in taken if r.start > day)])
    return DayRange(start, end)
