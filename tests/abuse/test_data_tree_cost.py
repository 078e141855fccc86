"""A batch item's ``data`` may hold millions of numbers within the batch's 4 MB: checking it for depth
and lone surrogates (``api.models.check_text_tree``) spelled a path and kept a stack entry for every
one of them, 1.4 s of the event loop and ~25 MB for 1.9 million (2026-11-28, a helper's probe:
another tenant's accept p99 went to 3.5 s while two loops sent such batches). Only containers are
kept now, and a path is spelled only for a container or a refusal."""

from __future__ import annotations

import tracemalloc

import pytest

from api.models import MAX_DATA_DEPTH, MAX_VALUES, check_text_tree


def test_numbers_in_a_data_tree_cost_no_entry_each() -> None:
    data = {"a": [0] * 200_000, "b": {str(i): 1.5 for i in range(20_000)}}
    tracemalloc.start()
    try:
        check_text_tree(data, field="data", max_values=1_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, peak  # an entry and a path per number held ~25 MB


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"a": [0, 1, "ok", "\ud800"]}, "data.a[3]"),
        ({"a": {"b": ["x", {"c": "\udfff"}]}}, "data.a.b[1].c"),
        ({"\ud800": 1}, "'data'"),
    ],
)
def test_a_lone_surrogate_is_still_refused_naming_where(data: object, named: str) -> None:
    with pytest.raises(ValueError, match="lone surrogate") as refused:
        check_text_tree(data, field="data")
    assert named in str(refused.value)


@pytest.mark.parametrize("leaf", [1, "x", [], {}, [1], {"k": 1}])
def test_depth_is_still_counted_to_the_leaves(leaf: object) -> None:
    def nested(depth: int) -> object:
        value = leaf
        for _ in range(depth):
            value = {"n": value}
        return value

    check_text_tree(nested(MAX_DATA_DEPTH - 1), field="data")
    with pytest.raises(ValueError, match="nested deeper"):
        check_text_tree(nested(MAX_DATA_DEPTH + 1), field="data")


def test_more_values_than_a_single_send_can_hold_are_refused_early() -> None:
    """A batch item may carry the batch's 4 MB: one of 1.9 million numbers held the event loop for
    1.7 s (checks, pydantic's copy, the request hash, the insert's JSON; a helper's probe)."""
    check_text_tree({"a": [0] * (MAX_VALUES - 1)}, field="data")  # the key "a" is a value too
    with pytest.raises(ValueError, match="more than 32,768 values"):
        check_text_tree({"a": [0] * MAX_VALUES}, field="data")
    with pytest.raises(ValueError, match="more than"):
        check_text_tree({"a": [[0] * 1_000 for _ in range(1_000)]}, field="data")
