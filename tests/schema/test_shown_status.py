"""The shown status and history derived from ``queued_at`` (schema/shown_status.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from schema.shown_status import shown_history, shown_status

AT = dt.datetime(2026, 11, 25, 12, 0, tzinfo=dt.UTC)
ACCEPTED = {"status": "accepted", "at": "2026-11-25T11:59:59+00:00", "detail": None}
SENDING = {"status": "sending", "at": "2026-11-25T12:00:01+00:00", "detail": None}
QUEUED = {"status": "queued", "at": AT.isoformat(), "detail": None}


@pytest.mark.parametrize(
    ("status", "queued_at", "shown"),
    [
        ("accepted", None, "accepted"),
        ("accepted", AT, "queued"),
        ("queued", None, "queued"),  # written before migration 0010
        ("sending", AT, "sending"),
        ("sent", AT, "sent"),
        ("scheduled", None, "scheduled"),
    ],
)
def test_only_an_accepted_row_the_broker_took_shows_as_queued(
    status: str, queued_at: dt.datetime | None, shown: str
) -> None:
    assert shown_status(status=status, queued_at=queued_at) == shown


@pytest.mark.parametrize(
    ("history", "queued_at", "shown"),
    [
        ([ACCEPTED], None, [ACCEPTED]),
        ([ACCEPTED], AT, [ACCEPTED, QUEUED]),
        ([ACCEPTED, SENDING], AT, [ACCEPTED, QUEUED, SENDING]),
        ([ACCEPTED, QUEUED, SENDING], AT, [ACCEPTED, QUEUED, SENDING]),  # stored before 0010: kept once
        ([], AT, [QUEUED]),
    ],
)
def test_history_gets_its_queued_entry_back_after_accepted(
    history: list[dict[str, object]], queued_at: dt.datetime | None, shown: list[dict[str, object]]
) -> None:
    assert shown_history(history=history, queued_at=queued_at) == shown
