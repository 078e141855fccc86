"""Claim due webhook deliveries: one statement, ``FOR UPDATE SKIP LOCKED``, a lease.

The lease is the row's own ``next_attempt_at``, pushed ``lease_s`` ahead at the claim: a claimed
delivery is invisible to every other ``clarion webhooks`` process until its outcome is recorded
or, if the process died mid-call, until the lease ends and another process sends it again
(at-least-once; the ``webhook-id`` lets the receiver drop the repeat). The lease outlasts a live
call (``clarion.webhook_settings.webhook_lease_floor_s``: the lookup, the call's limit, a margin), so a
claim takes a delivery whose call still runs only from a process starved past that margin. Only
deliveries of enabled endpoints are claimed: a disabled endpoint's pending deliveries wait for it
to be enabled again.
The claim counts the call (``attempts``), so a delivery that kills every process that takes it
still reaches ``CLARION_WEBHOOK_MAX_ATTEMPTS`` and is given up.

A tenant holds at most ``per_tenant`` of a process's calls at once
(``CLARION_WEBHOOK_CONCURRENCY_PER_TENANT``): the claim leaves out the tenants already at their
share in this process (``full``) and takes at most what each other tenant has left (``busy``:
tenants with calls in flight, and how many). Before, the oldest due deliveries took every free
call slot whoever they belonged to: ten endpoints of one tenant that never answer held all 32
calls, and another tenant's deliveries to a healthy endpoint waited up to 41 s (53 s and growing
with the breaker off; a helper's probe, 2026-11-28). With no tenant at its share, the candidates
are the first ``4 * limit`` due deliveries (``CLAIM``), so a claim sorts no more than that. With
one at its share, that would read past the full tenant's whole due backlog (12.5-21.9 ms a claim,
the tenant 100,000 deep), so the claim walks the tenants with pending deliveries instead, one
index probe each, and takes the oldest due deliveries of each of the others (``CLAIM_PAST_FULL``,
migration 0014): ``python -m bench.contention`` on a loaded machine, 2.3 against 39.9 ms (medians
of 20). Both still read past a disabled endpoint's due deliveries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from clarion.rows import from_row

_TAKE = """
, due AS (
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

# No tenant at its share: the oldest due deliveries, at most what each tenant has left of it.
CLAIM = (
    """
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
)"""
    + _TAKE
)

# Some tenant at its share: walk the tenants with pending deliveries one index probe each
# (``ix_webhook_deliveries_pending_tenant``, the loose index scan of PostgreSQL's wiki), and take
# from each of the others at most what it has left of its share, oldest first. ``CLAIM`` would
# read past the full tenant's whole due backlog to reach the others' rows. The tenant is matched
# with BETWEEN, not "=": with "=" and few tenants the planner took the due index instead, filtering
# it by tenant, and read past the backlog all the same (2 tenants, one 100,000 deep: 21.7 ms; with
# BETWEEN 0.22 ms, 0.64 ms with 22 tenants; EXPLAIN ANALYZE, 2026-11-28).
CLAIM_PAST_FULL = (
    """
WITH RECURSIVE tenants(tenant_id) AS (
    SELECT min(tenant_id) FROM webhook_deliveries WHERE state = 'pending'
  UNION ALL
    SELECT (SELECT min(d.tenant_id) FROM webhook_deliveries d
             WHERE d.state = 'pending' AND d.tenant_id > t.tenant_id)
      FROM tenants t WHERE t.tenant_id IS NOT NULL
), fair AS (
    SELECT c.id, c.created_at FROM tenants t
      LEFT JOIN unnest($5::text[], $6::int[]) AS busy(tenant_id, calls) ON busy.tenant_id = t.tenant_id
     CROSS JOIN LATERAL (
        SELECT d.id, d.created_at, d.next_attempt_at FROM webhook_deliveries d
         WHERE d.tenant_id BETWEEN t.tenant_id AND t.tenant_id
           AND d.state = 'pending' AND d.next_attempt_at <= now()
           AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.id = d.endpoint_id AND e.enabled)
         ORDER BY d.tenant_id, d.next_attempt_at  -- the index's order
         LIMIT greatest($4 - coalesce(busy.calls, 0), 0)
     ) c
     WHERE t.tenant_id IS NOT NULL AND t.tenant_id <> ALL($3::text[])
     ORDER BY c.next_attempt_at
     LIMIT $1
)"""
    + _TAKE
)


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
    sql = CLAIM_PAST_FULL if full else CLAIM
    rows = await pool.fetch(sql, limit, lease_s, full, per_tenant, list(busy), list(busy.values()))
    return [
        from_row(
            ClaimedDelivery,
            r,
            secrets=(r["secret"],) + ((r["previous_secret"],) if r["previous_secret"] else ()),
        )
        for r in rows
    ]
