"""Send-side dedupe: a notification is sent only by the worker that claimed it.

The claim is one conditional UPDATE over the whole batch: a row moves to ``sending`` with a lease
only from a claimable state (or from ``sending`` whose lease expired: its worker died). A
redelivered Kafka message for a notification that is ``sent`` or leased elsewhere claims nothing,
so it causes no provider call. The only window for a second provider call is a worker dying after
the provider accepted and before the outcome was recorded, once the lease expires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

import asyncpg

CLAIM = """
UPDATE notifications n
   SET status = 'sending',
       claims = least(n.claims + 1, 32767),
       lease_until = now() + make_interval(secs => $2),
       updated_at = now(),
       history = n.history || jsonb_build_array(jsonb_build_object(
           'status', 'sending',
           'at', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"'),
           'detail', NULL))
  FROM users u
 WHERE n.id = ANY($1::uuid[])
   AND u.id = n.user_id
   AND ((n.status IN ('accepted', 'queued', 'retrying', 'delayed', 'scheduled')
         AND (n.not_before IS NULL OR n.not_before <= now()))
        OR (n.status = 'sending' AND n.lease_until < now()))
RETURNING n.id, n.tenant_id, n.event_id, n.channel, n.category, n.priority, n.template, n.template_version,
          n.locale, n.content, n.data, n.attempts, n.claims, n.expires_at, n.user_id,
          u.external_id, u.email, u.phone, u.timezone, u.quiet_hours_start, u.quiet_hours_end
"""


async def claim_batch(*, pool: asyncpg.Pool, ids: Sequence[UUID], lease_s: float) -> list[dict[str, Any]]:
    """Claim every notification in ``ids`` that may be sent now; return the claimed rows.

    Ids not returned are already done, leased by another worker, or not yet due: skip them.
    """
    if not ids:
        return []
    rows = await pool.fetch(CLAIM, list(dict.fromkeys(ids)), lease_s)
    return [dict(r) for r in rows]
