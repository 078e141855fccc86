"""Claim due webhook deliveries: one statement, ``FOR UPDATE SKIP LOCKED``, a lease.

The lease is the row's own ``next_attempt_at``, pushed ``lease_s`` ahead at the claim: a claimed
delivery is invisible to every other ``clarion webhooks`` process until its outcome is recorded
or, if the process died mid-call, until the lease ends and another process sends it again
(at-least-once; the ``webhook-id`` lets the receiver drop the repeat). Only deliveries of enabled
endpoints are claimed: a disabled endpoint's pending deliveries wait for it to be enabled again.
The claim counts the call (``attempts``), so a delivery that kills every process that takes it
still reaches ``CLARION_WEBHOOK_MAX_ATTEMPTS`` and is given up.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from clarion.rows import from_row

CLAIM = """
WITH due AS (
    SELECT d.id, d.created_at FROM webhook_deliveries d
     WHERE d.state = 'pending' AND d.next_attempt_at <= now()
       AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = d.endpoint_id AND e.enabled)
     ORDER BY d.next_attempt_at
     LIMIT $1
     FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries d
   SET next_attempt_at = now() + make_interval(secs => $2),
       attempts = d.attempts + 1,
       last_attempt_at = now()
  FROM due, webhook_endpoints e
 WHERE d.id = due.id AND d.created_at = due.created_at AND e.id = d.endpoint_id
RETURNING d.id, d.created_at, d.endpoint_id, d.event_id, d.body, d.attempts, e.url, e.secret,
          CASE WHEN e.previous_secret_until > now() THEN e.previous_secret END AS previous_secret
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedDelivery:
    id: UUID
    created_at: datetime  # with ``id``, the row's key (the partition it lives in)
    endpoint_id: UUID
    event_id: UUID
    body: str
    attempts: int  # calls so far, this one included
    url: str
    secrets: tuple[str, ...]  # the current secret first; the previous one during a rotation

    @property
    def msg_id(self) -> str:
        """The ``webhook-id``: the event's id, the same on every retry and replay."""
        return str(self.event_id)


async def claim(*, pool: asyncpg.Pool, limit: int, lease_s: float) -> list[ClaimedDelivery]:
    """Up to ``limit`` due deliveries, leased to this caller for ``lease_s`` seconds."""
    rows = await pool.fetch(CLAIM, limit, lease_s)
    return [
        from_row(
            ClaimedDelivery,
            r,
            secrets=(r["secret"],) + ((r["previous_secret"],) if r["previous_secret"] else ()),
        )
        for r in rows
    ]
