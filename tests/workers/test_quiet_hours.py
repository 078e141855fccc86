"""When quiet hours end, in the user's zone, across midnight and DST changes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.preferences import CategoryRule, decide
from workers.quiet_hours import quiet_hours_end


def utc(year: int, month: int, day: int, hour: int, minute: int) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


@pytest.mark.parametrize(
    ("now", "zone", "start", "end", "expected"),
    [
        # 23:00 in Lisbon (summer, UTC+1) inside 22:00-07:00: ends 07:00 local next day = 06:00 UTC.
        (utc(2025, 7, 1, 22, 0), "Europe/Lisbon", "22:00", "07:00", utc(2025, 7, 2, 6, 0)),
        # 03:00 local, after midnight, same window: ends the same day.
        (utc(2025, 7, 2, 2, 0), "Europe/Lisbon", "22:00", "07:00", utc(2025, 7, 2, 6, 0)),
        # 12:00 local: outside.
        (utc(2025, 7, 2, 11, 0), "Europe/Lisbon", "22:00", "07:00", None),
        # The end itself is outside (half-open window).
        (utc(2025, 7, 2, 6, 0), "Europe/Lisbon", "22:00", "07:00", None),
        # A window within one day.
        (utc(2025, 7, 2, 13, 30), "UTC", "13:00", "14:00", utc(2025, 7, 2, 14, 0)),
        # No timezone: UTC.
        (utc(2025, 7, 2, 23, 0), None, "22:00", "07:00", utc(2025, 7, 3, 7, 0)),
    ],
)
def test_quiet_hours_end_in_the_users_zone(
    now: datetime, zone: str | None, start: str, end: str, expected: datetime | None
) -> None:
    assert quiet_hours_end(now=now, timezone=zone, start=start, end=end) == expected


def test_spring_forward_night_is_an_hour_shorter() -> None:
    # New York, 2025-03-09 02:00 EST -> 03:00 EDT. 23:00 EST on the 8th is 04:00 UTC.
    now = utc(2025, 3, 9, 4, 0)
    end = quiet_hours_end(now=now, timezone="America/New_York", start="22:00", end="07:00")
    assert end == utc(2025, 3, 9, 11, 0)  # 07:00 EDT
    assert (end - now).total_seconds() == 7 * 3600  # not 8: the clock skipped an hour


def test_fall_back_night_is_an_hour_longer() -> None:
    # New York, 2025-11-02 02:00 EDT -> 01:00 EST. 23:00 EDT on the 1st is 03:00 UTC.
    now = utc(2025, 11, 2, 3, 0)
    end = quiet_hours_end(now=now, timezone="America/New_York", start="22:00", end="07:00")
    assert end == utc(2025, 11, 2, 12, 0)  # 07:00 EST
    assert end is not None and (end - now).total_seconds() == 9 * 3600


def test_end_in_the_repeated_hour_is_its_next_occurrence() -> None:
    # Quiet 00:00-01:30 on the fall-back night; at 01:10 EST (the second 01:10) the first 01:30
    # (EDT) has passed, so quiet hours end at 01:30 EST = 06:30 UTC.
    second_pass = utc(2025, 11, 2, 6, 10)
    assert quiet_hours_end(now=second_pass, timezone="America/New_York", start="00:00", end="01:30") == utc(
        2025, 11, 2, 6, 30
    )
    first_pass = utc(2025, 11, 2, 5, 10)  # 01:10 EDT
    assert quiet_hours_end(now=first_pass, timezone="America/New_York", start="00:00", end="01:30") == utc(
        2025, 11, 2, 5, 30
    )


def test_end_in_the_skipped_hour_is_after_the_gap() -> None:
    # 02:30 does not exist in New York on 2025-03-09; quiet hours end once the clock passes it.
    now = utc(2025, 3, 9, 6, 0)  # 01:00 EST
    end = quiet_hours_end(now=now, timezone="America/New_York", start="00:00", end="02:30")
    assert end is not None and end > now
    assert end == utc(2025, 3, 9, 7, 30)  # 03:30 EDT


def test_unknown_timezone_falls_back_to_utc() -> None:
    now = utc(2025, 7, 2, 23, 0)
    assert quiet_hours_end(now=now, timezone="Not/AZone", start="22:00", end="07:00") == utc(2025, 7, 3, 7, 0)


@pytest.mark.parametrize(
    ("prefs", "rule", "opted_in", "source"),
    [
        ({}, None, True, "default"),
        ({}, CategoryRule(default_opted_in=False), False, "default"),
        ({("*", "*"): False}, None, False, "all channels"),
        ({("*", "*"): False, ("email", "*"): True}, None, True, "channel=email"),
        ({("email", "*"): True, ("*", "news"): False}, None, False, "category=news"),
        ({("*", "news"): False, ("email", "news"): True}, None, True, "channel=email category=news"),
        ({("email", "news"): False}, CategoryRule(required=True), True, "required"),
    ],
)
def test_most_specific_preference_decides(
    prefs: dict[tuple[str, str], bool], rule: CategoryRule | None, opted_in: bool, source: str
) -> None:
    decision = decide(prefs=prefs, channel="email", category="news", rule=rule)
    assert decision.opted_in is opted_in
    assert source in decision.source
