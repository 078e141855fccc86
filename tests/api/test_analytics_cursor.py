"""The analytics cursor round-trips a row's key and refuses, with 422 ``invalid_cursor``, a key
the database could not take even when it carries a valid MAC (a leaked secret)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest

from api.analytics_cursor import Position, Question, _mac, decode_cursor, encode_cursor
from api.errors import ApiError

SECRET = b"s" * 32
AT = datetime(2026, 3, 1, 5, tzinfo=UTC)
Q = Question("t-1", "hour", ("template", "template_version"), None, None, None)
US = int(AT.timestamp() * 1_000_000)


def signed(raw: Any) -> str:
    payload = json.dumps(raw, ensure_ascii=False).encode("utf-8", "surrogatepass")
    b64 = lambda b: base64.urlsafe_b64encode(b).decode().rstrip("=")  # noqa: E731
    return f"{b64(payload)}.{b64(_mac(SECRET, Q, payload))}"


@pytest.mark.parametrize("group", [("", 0), ('b\u00e9 "q" \\', 7), ("x" * 128, -(2**31))])
def test_a_key_round_trips(group: tuple[str, int]) -> None:
    position = Position(AT, AT.replace(day=3), AT.replace(hour=9), group)
    cursor = encode_cursor(secret=SECRET, question=Q, position=position)
    assert decode_cursor(secret=SECRET, question=Q, cursor=cursor) == position


@pytest.mark.parametrize(
    "raw",
    [
        [US, US, US, "a"],  # one value short
        [US, US, US, "a", 1, 2],
        [US, US, "a", 1],  # no until
        {"at": US},
        [US, US, "0", "a", 1],
        [US, US, 10**30, "a", 1],
        [US, -(10**30), US, "a", 1],
        [US, US, 1.5, "a", 1],
        [US, US, US, "a\x00b", 1],
        [US, US, US, "x" * 129, 1],
        [US, US, US, 5, 1],
        [US, US, US, "a", "1"],
        [US, US, US, "a", 2**31],
        [US, US, US, "a", True],
        [US, US, US, "\ud800", 1],  # a lone surrogate
        [US, US, US, None, 1],
    ],
)
def test_a_signed_key_the_database_could_not_take_is_refused(raw: Any) -> None:
    with pytest.raises(ApiError) as caught:
        decode_cursor(secret=SECRET, question=Q, cursor=signed(raw))
    assert caught.value.status == 422 and caught.value.code == "invalid_cursor"


def test_another_secret_is_refused() -> None:
    cursor = encode_cursor(secret=b"old", question=Q, position=Position(AT, AT, AT, ("a", 1)))
    with pytest.raises(ApiError):
        decode_cursor(secret=SECRET, question=Q, cursor=cursor)
