"""``GET /v1/analytics``: the tenant's counts and rates over a time range, per hour or day, grouped
by any of channel, template, template version, category and provider, read from the hourly
rollups (``core.analytics``), never from the log.

Rates: ``sent_rate`` and ``failure_rate`` are over ``accepted``; ``delivery_rate``,
``bounce_rate``, ``open_rate``, ``click_rate``, ``unsubscribe_rate`` and ``complaint_rate`` over
``sent`` (a notification counts once per kind: its first open, a click on any of its links).
A rate whose base is 0 is null. Grouped by provider, ``accepted`` sits under provider ``""`` (no
provider is chosen at accept).

Pages: an answer holds at most ``limit`` rows (``MAX_PAGE``, the default too), in the order bucket
``at``, then the grouping's values, and ``next_cursor`` names where the next page starts (null on
the last page). The cursor (``api/analytics_cursor.py``) is the last row's key, signed for this
tenant and this question: pages never repeat a row nor skip one there at the first page; rollups
that grow or first appear between pages after the cursor show in the pages not yet read, a group
that first appears behind it (in a bucket already read) only in a new read. Before paging one answer held up to 10,000 rows (422
``too_many_rows`` past that): 4.35 MB built in 420-480 ms on the API's event loop, and two loops
of such reads by one tenant took another tenant's accept p99 from 17.6 to 647 ms (2026-11-28, a
helper's probe); ``python -m bench.analytics_fairness`` measures it.

Errors (``ApiError``)::

    422 invalid_range      ``until`` not after ``since``, or the range holds more buckets than
                           MAX_BUCKETS of its interval
    422 invalid_group_by   an unknown or repeated grouping
    422 invalid_cursor     a cursor not issued for this tenant and this question
                           (``api/analytics_cursor.py``)
    429 too_many_searches  the tenant already runs its share of reads (``api/search_limit.py``)
    422 search_too_broad   the read took longer than ``CLARION_SEARCH_TIMEOUT_S``

A read takes one of the tenant's turns of the log searches and its time bound, on the search
engine's connections rather than the accept pool's: a tenant can make its rollups large (a
free-text ``category`` per send adds rows), and eight reads of 1 M rollup rows at once took 3.2 s
each and another tenant's accept p99 from 17 to 154 ms (2026-11-28, a helper's probe).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, Field
from pydantic_core import to_json
from sqlalchemy.ext.asyncio import AsyncEngine

from api.analytics_cursor import Position, Question, decode_cursor, encode_cursor, refused
from api.errors import ApiError
from api.search_limit import SearchLimit
from core.analytics import COUNTS

DIMENSIONS = ("channel", "template", "template_version", "category", "provider")
MAX_BUCKETS = {"hour": 24 * 31, "day": 400}
# A page of 1,000 rows (440 KB) cost the API 10-12.6 ms of CPU, one of 500 8.2 ms but twice the
# pages and aggregations per range (``bench.analytics_fairness --limit``, 2026-11-29).
MAX_PAGE = 1_000
_STEP = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
RATES = {
    "sent_rate": ("sent", "accepted"),
    "failure_rate": ("failed", "accepted"),
    "delivery_rate": ("delivered", "sent"),
    "bounce_rate": ("bounced", "sent"),
    "open_rate": ("opened", "sent"),
    "click_rate": ("clicked", "sent"),
    "unsubscribe_rate": ("unsubscribed", "sent"),
    "complaint_rate": ("complained", "sent"),
}
_RATE_PARTS = [(name, COUNTS.index(n), COUNTS.index(d)) for name, (n, d) in RATES.items()]


class AnalyticsRow(BaseModel):
    at: datetime = Field(description="start of the hour or day (UTC)")
    group: dict[str, str | int] = Field(description="the grouping's values, by dimension")
    counts: dict[str, int] = Field(description=", ".join(COUNTS))
    rates: dict[str, float | None] = Field(description=", ".join(RATES) + "; null when the base is 0")


class AnalyticsPage(BaseModel):
    """The answer's documented shape (the route sends ``Analytics.json()``, built without it)."""

    since: datetime
    until: datetime
    interval: Literal["hour", "day"]
    group_by: list[str]
    rows: list[AnalyticsRow]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last")


class Row(TypedDict):
    at: datetime
    group: dict[str, str | int]
    counts: dict[str, int]
    rates: dict[str, float | None]


@dataclass(frozen=True)
class Analytics:
    """One page of the answer, as plain data."""

    since: datetime
    until: datetime
    interval: Literal["hour", "day"]
    group_by: list[str]
    rows: list[Row]
    next_cursor: str | None

    def json(self) -> bytes:
        """The answer's body, serialized once, from plain dicts: no ``AnalyticsRow`` per row, no
        ``response_model`` pass. For 1,000 rows (timeit, three runs each, 2026-11-29) building
        took 6.0-7.5 ms as models read by ``Row._mapping`` and 2.6-3.1 ms as dicts by position;
        FastAPI's response_model path then took 1.8-2.3 ms and ``to_json`` takes 2.1 ms."""
        return to_json(self)


def parse_group_by(text: str | None) -> list[str]:
    """``"channel,template"`` -> the dimensions, in the caller's order; ``422 invalid_group_by``."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in DIMENSIONS]
    if unknown or len(set(names)) != len(names):
        raise ApiError(
            422,
            "invalid_group_by",
            f"group_by takes distinct names of: {', '.join(DIMENSIONS)}.",
            {"unknown": unknown[:5]},
        )
    return names


def _query(interval: str, group_by: list[str], *, after: bool, limit: int) -> str:
    """The page's SQL. Names are from DIMENSIONS and COUNTS only, never from the request; values
    are parameters. ``after`` adds the keyset condition on ``$7`` (the last row's ``at``) and
    ``$8...`` (its group values); ``hour >= $7`` lets the scan skip the buckets already read."""
    bucket = f"date_trunc('{interval}', hour, 'UTC')"
    dims = "".join(f", {d}" for d in group_by)
    sums = ", ".join(f"sum({c})::bigint AS {c}" for c in COUNTS)
    order = "1" + "".join(f", {i + 2}" for i in range(len(group_by)))
    keyset = ""
    if after:
        cast = {d: "int" if d == "template_version" else "text" for d in group_by}
        values = "".join(f", ${i + 8}::{cast[d]}" for i, d in enumerate(group_by))
        keyset = f"HAVING ({bucket}{dims}) > ($7::timestamptz{values})"
    return f"""
SELECT {bucket} AS at{dims}, {sums}
  FROM analytics_hourly
 WHERE tenant_id = $1 AND hour >= $2 AND hour < $3
   AND ($4::text IS NULL OR channel = $4) AND ($5::text IS NULL OR template = $5)
   AND ($6::text IS NULL OR category = $6){" AND hour >= $7" if after else ""}
 GROUP BY {order}
 {keyset}
 ORDER BY {order}
 LIMIT {limit + 1}
"""


def _row(r: Any, group_by: list[str]) -> Row:
    # By position, not ``Row._mapping`` (a mapping object per row): see ``Analytics.json``.
    k = len(group_by) + 1
    counts = r[k:]
    return {
        "at": r[0],
        "group": dict(zip(group_by, r[1:k], strict=True)),
        "counts": dict(zip(COUNTS, counts, strict=True)),
        "rates": {name: counts[n] / counts[d] if counts[d] else None for name, n, d in _RATE_PARTS},
    }


async def read_analytics(
    *,
    engine: AsyncEngine,
    searches: SearchLimit,
    cursor_secret: bytes,
    tenant_id: str,
    since: datetime | None,
    until: datetime | None,
    interval: Literal["hour", "day"],
    group_by: list[str],
    channel: str | None = None,
    template: str | None = None,
    category: str | None = None,
    cursor: str | None = None,
    limit: int = MAX_PAGE,
) -> Analytics:
    """One page of the tenant's rollups between ``since`` (inclusive; default a week before
    ``until``) and ``until`` (exclusive; default now), after ``cursor`` (from the start without
    one; it brings its range, which an explicit ``since``/``until`` must match), at most ``limit``
    rows."""
    question = Question(tenant_id, interval, tuple(group_by), channel, template, category)
    after: Position | None = None
    if cursor is not None:
        after = decode_cursor(secret=cursor_secret, question=question, cursor=cursor)
        if (since or after.since) != after.since or (until or after.until) != after.until:
            raise refused()
        since, until = after.since, after.until
    until = until or datetime.now(UTC)
    try:
        since = since or until - timedelta(days=7)
    except OverflowError:  # an `until` in the first week of year 1
        raise ApiError(
            422, "invalid_range", "'until' is too early for the default week: give 'since'."
        ) from None
    try:  # in UTC, as the cursor carries it and as `at` is: every page of a read answers it alike
        since, until = since.astimezone(UTC), until.astimezone(UTC)
    except OverflowError:  # an offset that moves year 1 or year 9999 out of range
        raise ApiError(
            422, "invalid_range", "'since' and 'until' must lie in the years 1 to 9999 in UTC."
        ) from None
    if until <= since:
        raise ApiError(422, "invalid_range", "'until' must be after 'since'.")
    if (until - since) / _STEP[interval] > MAX_BUCKETS[interval]:
        raise ApiError(
            422,
            "invalid_range",
            f"At most {MAX_BUCKETS[interval]} {interval}s in one request: narrow the range.",
        )
    params: tuple[Any, ...] = (tenant_id, since, until, channel, template, category)
    if after is not None:
        params += (after.at, *after.group)
    query = _query(interval, group_by, after=after is not None, limit=limit)
    async with searches.connect(engine=engine, tenant_id=tenant_id) as conn:
        rows = (await conn.exec_driver_sql(query, params)).all()
    more, rows = len(rows) > limit, rows[:limit]
    next_cursor = None
    if more:
        last = Position(since, until, rows[-1][0], tuple(rows[-1][1 : len(group_by) + 1]))
        next_cursor = encode_cursor(secret=cursor_secret, question=question, position=last)
    out = [_row(r, group_by) for r in rows]
    return Analytics(since, until, interval, group_by, out, next_cursor)
