"""Every status list written out in SQL names what ``schema/enums.py`` says it should.

The claim, the cancel, the relay, the ops queue depth and the pending index each spell their
statuses out in SQL (a partial index predicate must be a literal, and the hot statements are kept
as plain text). A status added to ``Status``, or moved in or out of ``TERMINAL_STATUSES`` or
``CLAIMABLE_STATUSES``, has to reach all of them in the same change; a list that misses it fails
here rather than leaving a notification that no claim, cancel or republish ever picks up.
"""

from __future__ import annotations

import re

import pytest

from api.lifecycle import CANCEL
from api.ops import _PENDING_SQL
from api.relay import PICK
from clarion.log_maintenance import LIVE_NOTIFICATION
from schema.enums import CLAIMABLE_STATUSES, TERMINAL_STATUSES, Status
from schema.log_models import Notification
from workers.claim import CLAIM
from workers.retry_lane import WAITING

LIVE = frozenset(Status) - TERMINAL_STATUSES
# The claimable statuses that wait for their not_before (the rest are due as soon as published).
WAITS_FOR_NOT_BEFORE = CLAIMABLE_STATUSES - {Status.accepted, Status.queued}
_LIST = re.compile(r"status\s+IN\s*\(([^)]*)\)", re.IGNORECASE)


def status_lists(sql: str) -> list[frozenset[str]]:
    """Each ``status IN ('a', 'b', ...)`` list in ``sql``, as a set of names."""
    return [frozenset(re.findall(r"'([a-z_]+)'", body)) for body in _LIST.findall(sql)]


def pending_index_predicate() -> str:
    table = Notification.metadata.tables["notifications"]
    (index,) = [i for i in table.indexes if i.name == "ix_notifications_pending"]
    return str(index.dialect_options["postgresql"]["where"])


def test_the_pattern_reads_a_list() -> None:
    assert status_lists("WHERE a AND status IN ('sent', 'dead') OR status  in ('x')") == [
        frozenset({"sent", "dead"}),
        frozenset({"x"}),
    ]


@pytest.mark.parametrize(
    ("where", "sql", "expected"),
    [
        ("the claim (workers/claim.py)", CLAIM, [CLAIMABLE_STATUSES]),
        ("the cancel (api/lifecycle.py)", CANCEL, [CLAIMABLE_STATUSES]),
        ("the relay's due waits (api/relay.py)", PICK, [WAITS_FOR_NOT_BEFORE]),
        ("the ops queue depth (api/ops.py)", _PENDING_SQL, [frozenset({"retrying", "delayed"}), LIVE]),
        ("the pending index (schema/log_models.py)", pending_index_predicate(), [LIVE]),
        ("the retention's live rows (clarion/log_maintenance.py)", LIVE_NOTIFICATION, [LIVE]),
        ("the retry lane's waits (workers/retry_lane.py)", WAITING, [frozenset({"retrying", "delayed"})]),
    ],
)
def test_each_sql_list_matches_the_enums(where: str, sql: str, expected: list[frozenset[str]]) -> None:
    assert status_lists(sql) == expected, where  # a Status is a str: equal sets either way


def test_every_listed_name_is_a_status() -> None:
    names = {s.value for s in Status}
    for sql in (CLAIM, CANCEL, PICK, _PENDING_SQL, pending_index_predicate(), WAITING):
        for listed in status_lists(sql):
            assert listed <= names, listed - names
