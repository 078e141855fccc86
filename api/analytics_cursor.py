"""The ``cursor`` of ``GET /v1/analytics``: where the next page starts, bound to one tenant's one
question.

A page is ordered by bucket ``at`` and then the grouping's values, and every output row has its
own such key (the rows are grouped by exactly those), so "the rows after the last row's key" never
repeats one nor skips one that was there when the key was read (one that first appears behind the
key, written between pages, is only in a new read). The cursor carries the range (``since`` and ``until``, so that a caller
who let them default to the last 7 days reads the same range on every page) and that key (``at``,
each in microseconds since the epoch, then the group values in the grouping's order), and an
HMAC-SHA256 (first 16 bytes) with the server's ``CLARION_SECRET_KEY`` over them, the tenant and
the rest of the question (interval, grouping, filters). A cursor is therefore only accepted for the tenant and the question that received it: one
from another tenant, another range or grouping, an edited one or one signed before the secret
was rotated is refused rather than silently read as a position in a different answer. The key's
values are checked again after the MAC (types, lengths, no NUL) so that even a leaked secret
cannot make a cursor the database fails on.

Errors (``ApiError``)::

    422 invalid_cursor  a cursor this API did not issue for this tenant and this question
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from api.errors import ApiError

CURSOR_PATTERN = r"^[A-Za-z0-9_-]{1,2800}\.[A-Za-z0-9_-]{22}$"
_MAC_BYTES = 16
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_MIN_US = (datetime(1, 1, 2, tzinfo=UTC) - _EPOCH) // _MICROSECOND
_MAX_US = (datetime(9999, 12, 30, tzinfo=UTC) - _EPOCH) // _MICROSECOND
# The longest value each text dimension's column holds (schema/log_models.py AnalyticsHourly).
TEXT_LENGTHS = {"channel": 8, "template": 128, "category": 64, "provider": 32}
_INT4 = 2**31


@dataclass(frozen=True)
class Question:
    """What one read asks beyond its range: a cursor is valid only for the same tenant and the
    same question (its range is in the cursor itself)."""

    tenant_id: str
    interval: str
    group_by: tuple[str, ...]
    channel: str | None
    template: str | None
    category: str | None

    def digest(self) -> bytes:
        fields = [
            self.tenant_id, self.interval, list(self.group_by), self.channel, self.template,
            self.category,
        ]  # fmt: skip
        return json.dumps(fields, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Position:
    """Where the next page starts: the range read, and the last row's bucket and group values."""

    since: datetime
    until: datetime
    at: datetime
    group: tuple[str | int, ...]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, question: Question, payload: bytes) -> bytes:
    return hmac.new(secret, question.digest() + b"\x00" + payload, hashlib.sha256).digest()[:_MAC_BYTES]


def _micros(at: datetime) -> int:
    return (at - _EPOCH) // _MICROSECOND


def _instant(micros: object) -> datetime:
    if type(micros) is not int or not _MIN_US <= micros <= _MAX_US:
        raise ValueError("time out of range")
    return _EPOCH + micros * _MICROSECOND


def refused() -> ApiError:
    return ApiError(
        422,
        "invalid_cursor",
        "The cursor is not one this API issued for this question; start again without it.",
    )


def encode_cursor(*, secret: bytes, question: Question, position: Position) -> str:
    p = position
    payload = json.dumps(
        [_micros(p.since), _micros(p.until), _micros(p.at), *p.group],
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()
    return f"{_b64(payload)}.{_b64(_mac(secret, question, payload))}"


def decode_cursor(*, secret: bytes, question: Question, cursor: str) -> Position:
    """The position a cursor names; ``ApiError`` 422 ``invalid_cursor`` for anything not issued by this
    API for this tenant and question."""
    try:
        body, dot, mac = cursor.partition(".")
        payload = _unb64(body)
        if not dot or not hmac.compare_digest(_unb64(mac), _mac(secret, question, payload)):
            raise ValueError("not signed for this question")
        raw = json.loads(payload)
        if not isinstance(raw, list) or len(raw) != 3 + len(question.group_by):
            raise ValueError("wrong shape")
        since, until, at, *values = raw
        for dim, value in zip(question.group_by, values, strict=True):
            if dim == "template_version":
                if type(value) is not int or not -_INT4 <= value < _INT4:
                    raise ValueError(dim)
            elif not isinstance(value, str) or len(value) > TEXT_LENGTHS[dim] or "\x00" in value:
                raise ValueError(dim)
            else:
                value.encode()  # a lone surrogate cannot be sent to PostgreSQL
        return Position(_instant(since), _instant(until), _instant(at), tuple(values))
    except (ValueError, TypeError, binascii.Error, UnicodeError) as exc:
        raise refused() from exc
