"""The status a reader sees: ``queued`` is derived from ``queued_at``, not stored.

Reaching the broker sets ``notifications.queued_at`` and leaves ``status = 'accepted'`` (and so
every index) alone, which keeps that write a HOT update (migration 0010, docs/partitioning.md).
Everything that shows or filters by status to a person goes through this module, so ``GET
/v1/notifications/{id}``, search and the ops counts keep showing ``accepted -> queued -> sending
-> ...`` exactly as when ``queued`` was written into the row. Rows written before 0010 hold
``status = 'queued'`` and a stored ``queued`` transition; they read the same.

The worker's claim and the relay read the stored columns directly: for them ``accepted`` with or
without ``queued_at`` are both claimable, and the relay tells them apart by ``queued_at``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from schema.enums import Status

STAMP_QUEUED = (
    "queued_at = CASE WHEN n.status = 'accepted' THEN coalesce(n.queued_at, now()) ELSE n.queued_at END"
)
"""The ``SET`` clause (on ``notifications n``) of both writers that record reaching the broker:
the outbox's mark (``api/outbox.py``) and a worker's claim of a row the mark skipped
(``workers/claim.py``). The first stamp stays."""

SHOWN_STATUS_SQL = "CASE WHEN status = 'accepted' AND queued_at IS NOT NULL THEN 'queued' ELSE status END"
"""The shown status as a SQL expression over the bare columns (``GROUP BY`` in raw SQL)."""


def shown_status(*, status: str, queued_at: dt.datetime | None) -> str:
    """The status to show for a row whose stored ``status`` and ``queued_at`` are these."""
    if status == Status.accepted and queued_at is not None:
        return Status.queued.value
    return status


def shown_history(
    *, history: Sequence[dict[str, Any]], queued_at: dt.datetime | None
) -> list[dict[str, Any]]:
    """The stored transitions with ``queued`` put back after ``accepted`` when the broker took
    the message (``queued_at``) and no stored entry says so already (rows from before 0010)."""
    entries = list(history)
    if queued_at is None or any(h.get("status") == Status.queued for h in entries):
        return entries
    queued = {"status": Status.queued.value, "at": queued_at.isoformat(), "detail": None}
    first = 1 if entries and entries[0].get("status") == Status.accepted else 0
    return [*entries[:first], queued, *entries[first:]]


def shown_status_column(table: sa.Table) -> sa.ColumnElement[str]:
    """The shown status as a SQLAlchemy expression over ``table`` (``notifications``)."""
    return sa.case(
        (
            sa.and_(table.c.status == Status.accepted.value, table.c.queued_at.is_not(None)),
            Status.queued.value,
        ),
        else_=table.c.status,
    )


def status_filter(table: sa.Table, statuses: Iterable[Status]) -> sa.ColumnElement[bool]:
    """``WHERE`` the shown status is one of ``statuses``, written so the stored ``status`` stays
    the indexed column the planner can use (``accepted``/``queued`` split on ``queued_at``)."""
    wanted = {Status(s) for s in statuses}
    plain = [s.value for s in wanted - {Status.accepted, Status.queued}]
    terms: list[sa.ColumnElement[bool]] = [table.c.status.in_(plain)] if plain else []
    if Status.queued in wanted:
        terms.append(table.c.status == Status.queued.value)
    if Status.accepted in wanted and Status.queued in wanted:
        terms.append(table.c.status == Status.accepted.value)
    elif Status.accepted in wanted:
        terms.append(sa.and_(table.c.status == Status.accepted.value, table.c.queued_at.is_(None)))
    elif Status.queued in wanted:
        terms.append(sa.and_(table.c.status == Status.accepted.value, table.c.queued_at.is_not(None)))
    return sa.or_(*terms) if terms else sa.false()
