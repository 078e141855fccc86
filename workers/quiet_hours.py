"""Quiet hours: push and SMS due while the user sleeps wait (status ``delayed``) until they end.

Quiet hours are wall-clock ``HH:MM`` times in the user's IANA timezone (UTC when none is set or
it is unknown); a window whose start is after its end spans midnight (``22:00``-``07:00``).
Email is held only in categories the tenant marked ``email_quiet_hours``. ``critical`` priority
is never held. The end is computed with ``zoneinfo``, so it is right across DST changes: a
wall-clock end that does not exist (spring forward) is read with the offset before the change
(02:30 becomes 03:30 daylight time), one that exists twice (fall back) is its first occurrence
still ahead.

A delayed notification carries ``not_before`` = the end; the relay republishes it then, and it
passes every screen again (preferences may have changed meanwhile).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, time, timedelta, tzinfo
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import asyncpg

from schema.enums import Channel, Priority, Status
from workers.claim import ClaimedNotification
from workers.outcome import Outcome
from workers.preferences import load_rules

log = logging.getLogger(__name__)


def _zone(name: str | None) -> tzinfo:
    if not name:
        return UTC
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        log.warning("unknown timezone %r; quiet hours use UTC", name)
        return UTC


def _hhmm(value: str) -> time:
    hours, minutes = value.split(":")
    return time(int(hours), int(minutes))


def quiet_hours_end(*, now: datetime, timezone: str | None, start: str, end: str) -> datetime | None:
    """When the quiet hours around ``now`` end (aware, UTC), or None when ``now`` is outside them."""
    zone = _zone(timezone)
    local = now.astimezone(zone)
    begin, finish = _hhmm(start), _hhmm(end)
    wall = local.time().replace(tzinfo=None)
    inside = begin <= wall < finish if begin < finish else (wall >= begin or wall < finish)
    if not inside:
        return None
    day = local.date() if wall < finish else local.date() + timedelta(days=1)
    for fold in (0, 1):  # the first occurrence of the end wall time that is still ahead
        candidate = datetime.combine(day, finish, tzinfo=zone).replace(fold=fold).astimezone(UTC)
        if candidate > now:
            return candidate
    return None


class QuietHoursScreen:
    """Delays notifications due inside the user's quiet hours (status ``delayed``, code ``quiet_hours``)."""

    name = "quiet_hours"

    def __init__(self, *, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def screen(self, rows: list[ClaimedNotification]) -> dict[UUID, Outcome]:
        """A ``delayed`` outcome with ``not_before`` = the end of quiet hours for each held row."""
        quiet = [
            r
            for r in rows
            if r.quiet_hours_start and r.quiet_hours_end and r.priority != Priority.critical.value
        ]
        email = {(r.tenant_id, r.category) for r in quiet if r.channel == Channel.email.value}
        rules = await load_rules(pool=self.pool, pairs=email) if email else {}
        now = datetime.now(UTC)
        stopped: dict[UUID, Outcome] = {}
        for r in quiet:
            assert r.quiet_hours_start is not None and r.quiet_hours_end is not None
            if r.channel == Channel.email.value:
                rule = rules.get((r.tenant_id, r.category))
                if rule is None or not rule.email_quiet_hours:
                    continue
            until = quiet_hours_end(
                now=now, timezone=r.timezone, start=r.quiet_hours_start, end=r.quiet_hours_end
            )
            if until is None:
                continue
            stopped[r.id] = Outcome(
                notification_id=r.id,
                status=Status.delayed,
                error_code="quiet_hours",
                error_message=f"held until the user's quiet hours end at {r.quiet_hours_end} ({r.timezone or 'UTC'})",
                not_before=until,
                detail=f"quiet hours until {until.isoformat()}",
            )
        return stopped
