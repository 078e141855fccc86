"""Which days a new partition covers: aligned spans, clipped around partitions already there."""

from __future__ import annotations

import datetime as dt

import pytest

from schema.partition_ranges import DayRange, free_range, span_start

THU = dt.date(2026, 11, 26)
MON = dt.date(2026, 11, 23)
DAY = dt.timedelta(days=1)


@pytest.mark.parametrize(
    ("day", "span", "start"),
    [
        (THU, 1, THU),
        (THU, 7, MON),
        (MON, 7, MON),
        (MON - DAY, 7, MON - 7 * DAY),  # a Sunday ends the week before
        (dt.date(2027, 1, 3), 7, dt.date(2026, 12, 28)),  # across a new year
    ],
)
def test_a_span_starts_on_a_fixed_grid_of_days(day: dt.date, span: int, start: dt.date) -> None:
    assert span_start(day, span) == start
    assert span_start(start + (span - 1) * DAY, span) == start  # the span's last day
    assert span_start(start + span * DAY, span) == start + span * DAY  # the next one's first


def test_a_week_is_a_monday_to_sunday_week_whatever_the_day_asked() -> None:
    for offset in range(7):
        assert span_start(MON + offset * DAY, 7) == MON


def test_a_span_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        span_start(THU, 0)
    with pytest.raises(ValueError, match="empty range"):
        DayRange(THU, THU)


def test_with_nothing_taken_the_partition_is_the_whole_span() -> None:
    assert free_range(THU, span_days=7, taken=[]) == DayRange(MON, MON + 7 * DAY)
    assert free_range(THU, span_days=1, taken=[]) == DayRange(THU, THU + DAY)


def test_days_partitioned_before_the_span_grew_are_left_to_their_own_partitions() -> None:
    # An install that made daily partitions up to Thursday, and one the following Tuesday.
    daily = [DayRange(MON + i * DAY, MON + (i + 1) * DAY) for i in range(4)]
    tuesday = DayRange(MON + 8 * DAY, MON + 9 * DAY)
    assert free_range(THU + DAY, span_days=7, taken=daily) == DayRange(THU + DAY, MON + 7 * DAY)
    assert free_range(MON + 7 * DAY, span_days=7, taken=[*daily, tuesday]) == DayRange(
        MON + 7 * DAY, MON + 8 * DAY
    )
    assert free_range(MON + 9 * DAY, span_days=7, taken=[*daily, tuesday]) == DayRange(
        MON + 9 * DAY, MON + 14 * DAY
    )


def test_a_day_already_covered_gets_no_second_partition() -> None:
    with pytest.raises(ValueError, match="already has a partition"):
        free_range(THU, span_days=7, taken=[DayRange(MON, MON + 7 * DAY)])


def test_a_range_lists_its_days_and_its_bounds() -> None:
    week = DayRange(MON, MON + 7 * DAY)
    assert list(week.days()) == [MON + i * DAY for i in range(7)]
    assert week.covers(MON) and week.covers(MON + 6 * DAY) and not week.covers(MON + 7 * DAY)
    assert week.bounds() == "FROM ('2026-11-23 00:00:00+00') TO ('2026-11-30 00:00:00+00')"
    assert week.within("day") == "day >= '2026-11-23 00:00:00+00' AND day < '2026-11-30 00:00:00+00'"
