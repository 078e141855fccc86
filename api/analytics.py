"""``GET /v1/analytics``: the tenant's counts and rates over a time range, per hour or day, grouped
by any of channel, template, template version, category and provider, read from the hourly
rollups (``core.analytics``), never from the log.

Rates: ``sent_rate`` and ``failure_rate`` are over ``accepted``; ``delivery_rate``,
``bounce_rate``, ``open_rate``, ``click_rate``, ``unsubscribe_rate`` and ``complaint_rate`` over
``sent`` (a notification counts once per kind: its first open, a click on any of its links).
A rate whose base is 0 is null. Grouped by provider, ``accepted`` sits under provider ``""`` (no
provider is chosen at accept).

Errors (``ApiError``)::

    422 invalid_range      ``until`` not after ``since``, or the range holds more buckets than
                           MAX_BUCKETS of its interval
    422 invalid_group_by   an unknown or repeated grouping
    422 too_many_rows      more than MAX_ROWS groups x buckets: narrow the range or the grouping
    429 too_many_searches  the tenant already runs its share of reads (``api/search_limit.py``)
    422 search_too_broad   the read took longer than ``CLARION_SEARCH_TIMEOUT_S``

A read takes one of the tenant's turns of the log searches and its time bound, on the search
engine's connections rather than the accept pool's: a tenant can make its rollups large (a
free-text ``category`` per send adds rows), and eight reads of 1 M rollup rows at once took 3.2 s
each and another tenant's accept p99 from 17 to 154 ms (2026-11-28, a helper's probe).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncEngine

from api.errors import ApiError
from api.search_limit import SearchLimit
from core.analytics import COUNTS

DIMENSIONS = ("channel", "template", "template_version", "category", "provider")
MAX_BUCKETS = {"hour": 24 * 31, "day": 400}
MAX_ROWS = 10_000
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


class AnalyticsRow(BaseModel):
    at: datetime = Field(description="start of the hour or day (UTC)")
    group: dict[str, str | int] = Field(description="the grouping's values, by dimension")
    counts: dict[str, int] = Field(description=", ".join(COUNTS))
    rates: dict[str, float | None] = Field(description=", ".join(RATES) + "; null when the base is 0")


class AnalyticsPage(BaseModel):
    since: datetime
    until: datetime
    interval: Literal["hour", "day"]
    group_by: list[str]
    rows: list[AnalyticsRow]


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


async def read_analytics(
    *,
    engine: AsyncEngine,
    searches: SearchLimit,
    tenant_id: str,
    since: datetime,
    until: datetime,
    interval: Literal["hour", "day"],
    group_by: list[str],
    channel: str | None = None,
    template: str | None = None,
    category: str | None = None,
) -> AnalyticsPage:
    """The tenant's rollups between ``since`` (inclusive) and ``until`` (exclusive)."""
    if until <= since:
        raise ApiError(422, "invalid_range", "'until' must be after 'since'.")
    if (until - since) / _STEP[interval] > MAX_BUCKETS[interval]:
        raise ApiError(
            422,
            "invalid_range",
            f"At most {MAX_BUCKETS[interval]} {interval}s in one request: narrow the range.",
        )
    dims = ", ".join(group_by)
    sums = ", ".join(f"sum({c})::bigint AS {c}" for c in COUNTS)
    # Names are from DIMENSIONS and COUNTS only, never from the request; values are parameters.
    query = f"""
SELECT date_trunc('{interval}', hour, 'UTC') AS at{", " + dims if dims else ""}, {sums}
  FROM analytics_hourly
 WHERE tenant_id = $1 AND hour >= $2 AND hour < $3
   AND ($4::text IS NULL OR channel = $4) AND ($5::text IS NULL OR template = $5)
   AND ($6::text IS NULL OR category = $6)
 GROUP BY 1{"".join(f", {i + 2}" for i in range(len(group_by)))}
 ORDER BY 1{"".join(f", {i + 2}" for i in range(len(group_by)))}
 LIMIT {MAX_ROWS + 1}
"""
    async with searches.connect(engine=engine, tenant_id=tenant_id) as conn:
        result = await conn.exec_driver_sql(query, (tenant_id, since, until, channel, template, category))
        rows = [r._mapping for r in result.all()]
    if len(rows) > MAX_ROWS:
        raise ApiError(422, "too_many_rows", f"More than {MAX_ROWS} rows: narrow the range or the grouping.")
    out = []
    for r in rows:
        counts = {c: int(r[c]) for c in COUNTS}
        rates = {name: (counts[n] / counts[d] if counts[d] else None) for name, (n, d) in RATES.items()}
        out.append(AnalyticsRow(at=r["at"], group={d: r[d] for d in group_by}, counts=counts, rates=rates))
    return AnalyticsPage(since=since, until=until, interval=interval, group_by=group_by, rows=out)
