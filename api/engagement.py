"""Engagement reported to the API: by a tenant's backend (API key) or by a device (the push's token).

Both find the notification, clamp the event's time between the notification's creation and now,
and fold it into its ``engagement`` row (``core.engagement``): the same report twice is counted
once. The provider webhooks (``api.webhooks``) record theirs through :func:`count_recorded` too.

Errors (``ApiError``)::

    403 invalid_token   the device's token is forged, expired or malformed
    404 not_found       no such notification for this tenant (another tenant's id too)
    422 too_many_links  a click on a new link past the MAX_LINKS this notification has
    422 too_many_reports  a new report past the MAX_COUNTED its (type, link) has counted
    429 engagement_busy   the tenant's reports hold their share of the pool (``api.engagement_gate``)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from uuid import UUID

import asyncpg

from api.engagement_gate import LOCK_TIMEOUT_MS, EngagementGate
from api.engagement_models import EngagementIn, EngagementRecorded
from api.errors import ApiError
from clarion import metrics
from clarion.engagement_tokens import InvalidToken, verify_engagement_token
from clarion.missing_days import once_more_if_moved
from core.engagement import MAX_COUNTED, MAX_LINKS, EngagementEvent, Recorded, record_engagement
from schema.enums import EngagementType

_FIND = "SELECT channel, created_at FROM notifications WHERE id = $1 AND tenant_id = $2"
# Every read names the notification's created_at: the partition key, so one day is probed.
_LINKS = """
SELECT count(*) FILTER (WHERE link = $3) AS same, count(*) AS links FROM engagement
 WHERE notification_id = $1 AND type = 'clicked' AND tenant_id = $2 AND notification_created_at = $4
"""
_ROW = """
SELECT type, link, first_at, last_at, count, source FROM engagement
 WHERE notification_id = $1 AND type = $2 AND link = $3 AND tenant_id = $4 AND notification_created_at = $5
"""


def count_recorded(recorded: Sequence[Recorded], channel: str) -> None:
    """``clarion_engagement_events_total`` for the events counted (replays are not), one increment
    per type (a SendGrid chunk counts up to 500: 4.5 us each, on the event loop)."""
    for kind, n in Counter(r.event.type.value for r in recorded if r.counted).items():
        metrics.ENGAGEMENT_EVENTS.labels(channel, kind).inc(n)


def clamp(at: datetime | None, *, created_at: datetime, now: datetime) -> datetime:
    """An event's time kept between its notification's creation and now (a device's clock is
    anyone's guess; an event before its send, or in the future, would skew first/last)."""
    return min(max(at or now, created_at), now)


def device_claims(*, token: str, secrets: Sequence[str]) -> tuple[str, UUID]:
    """(tenant, notification) a device's token names; ``403 invalid_token`` otherwise."""
    try:
        claims = verify_engagement_token(token, secrets=secrets)
    except InvalidToken:
        raise ApiError(403, "invalid_token", "This event token is invalid or has expired.") from None
    return claims.tenant_id, claims.notification_id


def _busy() -> ApiError:
    return ApiError(
        429,
        "engagement_busy",
        "This tenant's engagement reports already hold their share of the database; retry in a second.",
        headers={"Retry-After": "1"},
    )


async def report_engagement(
    *,
    pool: asyncpg.Pool,
    gate: EngagementGate,
    tenant_id: str,
    notification_id: UUID,
    report: EngagementIn,
    source: str,
) -> EngagementRecorded:
    """Record one reported open or click of the tenant's notification; the row as it is now."""
    now = datetime.now(UTC)
    link = report.link or ""
    occurred = report.occurred_at.astimezone(UTC).isoformat() if report.occurred_at else "-"
    async with gate.turn(tenant_id) as mine:
        if not mine:
            raise _busy()

        async def write() -> tuple[asyncpg.Record, list[Recorded], asyncpg.Record]:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                found = await conn.fetchrow(_FIND, notification_id, tenant_id)
                if found is None:
                    raise ApiError(404, "not_found", f"No notification {notification_id}.")
                if link:
                    links = await conn.fetchrow(_LINKS, notification_id, tenant_id, link, found["created_at"])
                    if not links["same"] and links["links"] >= MAX_LINKS:
                        raise ApiError(
                            422,
                            "too_many_links",
                            f"This notification already has clicks on {MAX_LINKS} links.",
                        )
                event = EngagementEvent(
                    tenant_id=tenant_id,
                    notification_id=notification_id,
                    notification_created_at=found["created_at"],
                    type=EngagementType(report.type.value),
                    at=clamp(report.occurred_at, created_at=found["created_at"], now=now),
                    source=source,
                    link=link,
                    marker=f"report:{report.type.value}:{occurred}:{link}",
                )
                recorded = await record_engagement(conn=conn, events=[event])
                if recorded[0].capped:
                    raise ApiError(
                        422, "too_many_reports",
                        f"This notification already has {MAX_COUNTED} reports of {event.type.value}"
                        + (" on this link." if link else "."),
                    )  # fmt: skip
                row = await conn.fetchrow(
                    _ROW, notification_id, event.type.value, link, tenant_id, found["created_at"]
                )
                return found, recorded, row

        try:  # refused as its day moved out of a default partition: written again
            found, recorded, row = await once_more_if_moved(write)
        except asyncpg.LockNotAvailableError:
            raise _busy() from None
    count_recorded(recorded, found["channel"])
    return EngagementRecorded(
        notification_id=notification_id,
        type=row["type"],
        link=row["link"] or None,
        first_at=row["first_at"],
        last_at=row["last_at"],
        count=row["count"],
        source=row["source"],
        duplicate=not recorded[0].counted,
    )
