"""Analytics rollups: hourly counts per (tenant, channel, template, template version, category,
provider), kept up to date as notifications are accepted, end and are engaged with, so reading
them never scans the log.

Who adds what, each in the transaction that makes it true unless said otherwise:

- ``accepted``: the API, after the accept transaction committed, added up in memory and written
  once a second (``api/accepted_counts.py``; a crash loses up to that second's counts: the rollup
  is a view for people, the log is the record), keyed by the hour of acceptance;
- ``sent``, ``failed`` (also ``dead`` and ``expired``), ``suppressed``: the worker's record step,
  only for rows it moved to that status (a replayed outcome counts nothing), keyed by the hour the
  notification was accepted;
- ``delivered``, ``bounced``, ``opened``, ``clicked``, ``unsubscribed``, ``complained``: the
  engagement upsert, once per notification and type (the first open, however many follow).

Rates read against these: a notification's outcome lands in the hour it was *accepted*, so an
hour's ``sent / accepted`` is that hour's cohort. ``accepted`` has no provider yet (provider
``''``): grouped by provider, rates use ``sent`` as their base.

Errors: asyncpg errors pass through (the caller's transaction decides).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import asyncpg

COUNTS = (
    "accepted", "sent", "failed", "suppressed", "delivered", "bounced", "opened", "clicked",
    "unsubscribed", "complained",
)  # fmt: skip
# Statuses the record step counts, and under which count.
STATUS_COUNTS = {
    "sent": "sent",
    "failed": "failed",
    "dead": "failed",
    "expired": "failed",
    "suppressed": "suppressed",
}
ENGAGEMENT_COUNTS = frozenset(COUNTS[4:])


@dataclass(frozen=True, slots=True)
class RollupKey:
    tenant_id: str
    hour: datetime
    channel: str
    template: str = ""  # '' for inline content
    template_version: int = 0
    category: str = ""
    provider: str = ""


_UPSERT = f"""
INSERT INTO analytics_hourly AS a (tenant_id, hour, channel, template, template_version, category,
                                   provider, {", ".join(COUNTS)})
SELECT * FROM unnest($1::text[], $2::timestamptz[], $3::text[], $4::text[], $5::int[], $6::text[],
                     $7::text[], {", ".join(f"${i + 8}::bigint[]" for i in range(len(COUNTS)))})
ON CONFLICT (tenant_id, hour, channel, template, template_version, category, provider)
DO UPDATE SET {", ".join(f"{c} = a.{c} + excluded.{c}" for c in COUNTS)}
"""


def hour_of(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


async def add_counts(
    *, conn: asyncpg.Connection | asyncpg.Pool, count: str, keys: Iterable[RollupKey]
) -> None:
    """Add one to ``count`` for each key (repeats add up)."""
    if count not in COUNTS:
        raise ValueError(f"not an analytics count: {count!r}")
    await add_many(conn=conn, counts={key: Counter({count: n}) for key, n in Counter(keys).items()})


async def add_many(*, conn: asyncpg.Connection | asyncpg.Pool, counts: dict[RollupKey, Counter[str]]) -> None:
    """Add every key's counts in one statement, keys in sorted order: two transactions touching
    the same rollup rows lock them in the same order (one statement per count, in two workers'
    record transactions, could lock one row for "sent" and another for "failed" crosswise)."""
    if not counts:
        return
    ordered = sorted(counts, key=lambda k: (k.tenant_id, k.hour, k.channel, k.template, k.template_version,
                                            k.category, k.provider))  # fmt: skip
    columns: list[list[object]] = [
        [k.tenant_id for k in ordered],
        [k.hour for k in ordered],
        [k.channel for k in ordered],
        [k.template for k in ordered],
        [k.template_version for k in ordered],
        [k.category for k in ordered],
        [k.provider for k in ordered],
    ]
    columns += [[counts[k][c] for k in ordered] for c in COUNTS]
    await conn.execute(_UPSERT, *columns)
