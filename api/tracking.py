"""Clarion's own email tracking, answered: the open pixel ``GET /t/o/<token>`` and the link
redirect ``GET /t/c/<token>`` (the tokens: ``clarion.tracking_tokens``; the rewriting:
``workers/email_tracking.py``).

Each genuine hit is folded into the notification's ``engagement`` row (``core.engagement``):
``opened``, or ``clicked`` with its link. A hit whose ``User-Agent`` is a known prefetcher (Apple
Mail Privacy Protection's proxy, corporate link scanners, crawlers) is recorded as ``prefetched``
instead: shown beside the status history, never counted as a person's open or click. The redirect
goes to the link the token carries, whatever happened to the notification since (a mail read
after the log's retention still leads where it said); the pixel is a 1x1 transparent GIF.

Errors (``ApiError``)::

    403 invalid_token   the token is forged, altered or malformed (no redirect, no pixel)
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from datetime import UTC, datetime

import asyncpg

from api.engagement import count_recorded
from api.engagement_gate import LOCK_TIMEOUT_MS, EngagementGate
from api.errors import ApiError
from clarion import metrics
from clarion.missing_days import once_more_if_moved
from clarion.tracking_tokens import InvalidToken, TrackingClaims, verify_tracking_token
from core.engagement import EngagementEvent, Recorded, record_engagement
from schema.enums import EngagementType

PIXEL = base64.b64decode("R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7")  # 1x1 transparent GIF

# Lower-case substrings of user agents that fetch a mail's images or links without a person.
_PREFETCHERS = (
    "bot", "spider", "crawler", "preview", "barracuda", "mimecast", "proofpoint", "urldefense",
    "safelinks", "linkscanner", "headlesschrome", "python-", "curl/", "wget/", "go-http-client",
)  # fmt: skip
# Apple Mail Privacy Protection fetches every image through a proxy that sends exactly this.
_APPLE_PROXY = "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko)"
_FIND = "SELECT channel, created_at FROM notifications WHERE id = $1 AND tenant_id = $2"


def is_prefetch(user_agent: str | None) -> bool:
    """Whether a hit with this ``User-Agent`` is a machine fetching ahead of (or instead of) a person."""
    if not user_agent:
        return True  # mail clients send one; what sends none is a script
    if user_agent.strip() == _APPLE_PROXY:
        return True
    lowered = user_agent.lower()
    return any(agent in lowered for agent in _PREFETCHERS)


def claims_of(token: str, *, secrets: Sequence[str]) -> TrackingClaims:
    """The claims of a genuine tracking token; ``403 invalid_token`` otherwise."""
    try:
        return verify_tracking_token(token, secrets=secrets)
    except InvalidToken:
        raise ApiError(403, "invalid_token", "This tracking link is invalid.") from None


async def record_hit(
    *, pool: asyncpg.Pool, gate: EngagementGate, claims: TrackingClaims, user_agent: str | None
) -> None:
    """Fold one pixel or link hit into its notification's engagement (nothing when the notification
    is gone, past the log's retention, or when the hit gets no turn: ``api.engagement_gate``)."""
    if claims.link is not None:
        kind = EngagementType.clicked
    else:
        kind = EngagementType.opened
    if is_prefetch(user_agent):
        kind = EngagementType.prefetched
    async with gate.turn(claims.tenant_id) as mine:
        if not mine:
            metrics.TRACKING_HITS_UNRECORDED.labels("busy").inc()
            return

        async def write() -> tuple[asyncpg.Record, list[Recorded]] | None:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                found = await conn.fetchrow(_FIND, claims.notification_id, claims.tenant_id)
                if found is None:
                    return None
                event = EngagementEvent(
                    tenant_id=claims.tenant_id,
                    notification_id=claims.notification_id,
                    notification_created_at=found["created_at"],
                    type=kind,
                    at=datetime.now(UTC),
                    source="email_tracking",
                    link=claims.link or "",
                )
                return found, await record_engagement(conn=conn, events=[event])

        try:  # refused as its day moved out of a default partition: written again
            written = await once_more_if_moved(write)
        except asyncpg.LockNotAvailableError:
            metrics.TRACKING_HITS_UNRECORDED.labels("locked").inc()
            return
    if written is None:
        return
    found, recorded = written
    count_recorded(recorded, found["channel"])
