"""Claim due webhook deliveries: one statement, ``FOR UPDATE SKIP LOCKED``, a lease.

The lease is the row's own ``next_attempt_at``, pushed ``lease_s`` ahead at the claim: a claimed
delivery is invisible to every other ``clarion webhooks`` process until its outcome is recorded
or, if the process died mid-call, until the lease ends and another process sends it again
(at-least-once; the ``webhook-id`` lets the receiver drop the repeat). Only deliveries of enabled
endpoints are claimed: a disabled endpoint's pending deliveries wait for it to be enabled again.
The claim counts the call (``attempts``), so a delivery that kills every process that takes it
still reaches ``CLARION_WEBHOOK_MAX_ATTEMPTS`` and is given up.

A tenant holds at most ``per_tenant`` of a process's calls at once
(``CLARION_WEBHOOK_CONCURRENCY_PER_TENANT``): the claim leaves out the tenants already at their
share in this process (``full``) and takes at most what each other tenant has left (``busy``:
tenants with calls in flight, and how many). Before, the oldest due deliveries took every free
call slot whoever they belonged to: ten endpoints of one tenant that never answer held all 32
calls, and another tenant's deliveries to a healthy endpoint waited up to 41 s (53 s and growing
with the breaker off; a helper's probe, 2026-11-28). The candidates are the first ``4 * limit``
due deliveries of tenants not at their share, so a claim sorts no more than that, but it reads
past a full tenant's due backlog, as it already read past a disabled endpoint's: 0.25 ms for a
claim of 32 as before, 12.5-21.9 ms (medians of 20, two runs) with a full tenant 100,000 due
deliveries deep (``python -m bench.contention``). A per-tenant index walked tenant by tenant would not read the
backlog; not built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from clarion.rows import from_row

CLAIM = """
WITH candidates AS (
    SELECT d.id, d.created_at, d.tenant_id, d.next_attempt_at FROM webhook_deliveries d
     WHERE d.state = 'pending' AND d.next_attempt_at <= now()
       AND d.tenant_id <> ALL($3::text[])
       AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = d.endpoint_id AND e.enabled)
     ORDER BY d.next_attempt_at
     LIMIT 4 * $1
), fair AS (
    SELECT r.id, r.created_at FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.tenant_id ORDER BY c.next_attempt_at) AS nth
          FROM candidates c
    ) r
      LEFT JOIN unnest($5::text[], $6::int[]) AS busy(tenant_id, calls) ON busy.tenant_id = r.tenant_id
     WHERE r.nth <= $4 - coalesce(busy.calls, 0)
     ORDER BY r.next_attempt_at
     LIMIT $1
), due AS (
    SELECT d.id, d.created_at FROM webhook_deliveries d JOIN fair f ON d.id = f.id AND d.created_at = f.created_at
     WHERE d.state = 'pending' AND d.next_attempt_at <= now()
       FOR UPDATE OF d SKIP LOCKED
)
UPDATE webhook_deliveries d
   SET next_attempt_at = now() + make_interval(secs => $2),
       attempts = d.attempts + 1,
       last_attempt_at = now()
  FROM due, webhook_endpoints e
 WHERE d.id = due.id AND d.created_at = due.created_at AND e.id = d.endpoint_id
RETURNING d.id, d.created_at, d.tenant_id, d.endpoint_id, d.event_id, d.body, d.attempts, e.url, e.secret,
          CASE WHEN e.previous_secret_until > now() THEN e.previous_secret END AS previous_secret
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimedDelivery:
    id: UUID
    created_at: datetime  # with ``id``, the row's key (the partition it lives in)
    tenant_id: str
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


async def claim(
    *,
    pool: asyncpg.Pool,
    limit: int,
    lease_s: float,
    per_tenant: int,
    busy: Mapping[str, int] | None = None,
) -> list[ClaimedDelivery]:
    """Up to ``limit`` due deliveries, leased to this caller for ``lease_s`` seconds, at most
    ``per_tenant`` of one tenant counting the calls ``busy`` says it has in flight here."""
    busy = busy or {}
    full = [tenant for tenant, calls in busy.items() if calls >= per_tenant]
    rows = await pool.fetch(CLAIM, limit, lease_s, full, per_tenant, list(busy), list(busy.values()))
    return [
        from_row(
            ClaimedDelivery,
            r,
            secrets=(r["secret"],) + ((r["previous_secret"],) if r["previous_secret"] else ()),
        )
        for r in rows
    ]
