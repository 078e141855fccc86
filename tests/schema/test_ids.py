"""A UUIDv7 gives back the time it was made, to the millisecond."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from schema.ids import created_window, uuid7, uuid7_at, uuid7_texts, uuid7_time


def test_a_uuid7_carries_its_creation_time() -> None:
    before = dt.datetime.now(dt.UTC) - dt.timedelta(milliseconds=1)
    value = uuid7()
    after = dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=1)
    assert before <= uuid7_time(value) <= after


@pytest.mark.parametrize("count", [0, 1, 2, 3, 500])
def test_a_batch_of_uuid7_texts_are_distinct_uuid7s_of_this_millisecond(count: int) -> None:
    before = dt.datetime.now(dt.UTC) - dt.timedelta(milliseconds=1)
    values = [uuid.UUID(text) for text in uuid7_texts(count)]
    after = dt.datetime.now(dt.UTC) + dt.timedelta(milliseconds=1)
    assert len(set(values)) == count
    for value in values:
        assert (value.version, value.variant) == (7, uuid.RFC_4122)
        assert before <= uuid7_time(value) <= after


def test_a_known_uuid7_decodes_to_its_time() -> None:
    # RFC 9562 appendix A.6 example: 017F22E2-79B0-7CC3-98C4-DC0C0C07398F, Tue Feb 22 19:22:22 UTC 2022.
    value = uuid.UUID("017F22E2-79B0-7CC3-98C4-DC0C0C07398F")
    assert uuid7_time(value) == dt.datetime(2022, 2, 22, 19, 22, 22, tzinfo=dt.UTC)


def test_other_uuid_versions_are_refused() -> None:
    with pytest.raises(ValueError):
        uuid7_time(uuid.uuid4())


def test_a_window_holds_each_ids_day_and_a_foreign_or_forged_id_widens_it_to_every_day() -> None:
    ids = [uuid7_at(dt.datetime(2026, 11, 24, 23, 59, 59, tzinfo=dt.UTC)), uuid7()]
    since, until = created_window(ids)
    assert since == dt.datetime(2026, 11, 23, 23, 59, 59, tzinfo=dt.UTC)
    assert until >= dt.datetime.now(dt.UTC) + dt.timedelta(hours=23)
    forged = uuid.UUID("ffffffff-ffff-7fff-bfff-ffffffffffff")  # a "time" in the year 10889
    for hostile in (uuid.uuid4(), forged):
        since, until = created_window([*ids, hostile])
        assert since.year == 1970 and until.year == 9999
