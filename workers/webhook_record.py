"""Record one webhook call's result: the delivery's next state and its endpoint's failure streak.

- success: the delivery is ``delivered``; the endpoint's streak is reset.
- failure: the delivery waits ``backoff_s`` (exponential, jittered, at least a 429/503's
  Retry-After), or is ``failed`` after ``max_attempts`` calls; the endpoint's streak grows, and
  once it holds ``disable_after_failures`` calls over at least ``disable_after_s`` of failing, the
  endpoint is disabled with the reason stored (``GET /v1/webhook-endpoints/{id}`` shows it) and
  its pending deliveries are parked until it is enabled again, those being queued to it in that
  instant too (``park_queued``).
- deferred (the endpoint's breaker is open, no call made): the delivery waits until the breaker
  lets a call through, and the claim's attempt is given back.

A result is written only while the delivery is still this caller's (same ``attempts``, still
pending): after a lease expired and another process took it, that process's result counts. A
result is never lost to the partition upkeep moving the delivery's row out of the default
partition (``_update_ours``).

Lock order: the endpoint's row before any of its deliveries', here and in the tenant's disable,
delete and enable (``api.webhook_endpoints``); a write of one delivery alone (a success while the
endpoint has no streak, a deferral, the claim with ``SKIP LOCKED``) waits for no endpoint. Before
(2026-11-29), a record wrote its delivery first: a failure that disabled the endpoint parked its
deliveries holding the endpoint, and waited for one whose record held that delivery and waited
for the endpoint. PostgreSQL broke the deadlock after ``deadlock_timeout`` (1 s) by cancelling one
record, which ``until_done`` wrote again. The tenant's disable and delete parked or cancelled
before taking the endpoint; beside a record taking it first, they now take it first too
(``tests/workers/test_webhook_record_locks.py`` forces both interleavings).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

import asyncpg

from core.webhook_events import LOCK_ENDPOINT, PARK_PENDING, PARKED_AT
from workers.record import storable
from workers.webhook_claim import ClaimedDelivery
from workers.webhook_send import CallResult

log = logging.getLogger(__name__)

DELIVERED = """
UPDATE webhook_deliveries
   SET state = 'delivered', delivered_at = now(), last_status = $3, last_error = NULL
 WHERE id = $1 AND created_at = $2 AND state = 'pending'
"""
# A delivery parked while its call was in flight (the endpoint disabled meanwhile) stays parked:
# due again, every claim would read past it for as long as the endpoint stays disabled.
_UNLESS_PARKED = f"CASE WHEN next_attempt_at >= '{PARKED_AT}' THEN next_attempt_at ELSE {{}} END"
FAILED = f"""
UPDATE webhook_deliveries
   SET state = CASE WHEN attempts >= $4 THEN 'failed' ELSE state END,
       next_attempt_at = {_UNLESS_PARKED.format("now() + make_interval(secs => $5)")},
       last_status = $6, last_error = $7
 WHERE id = $1 AND created_at = $2 AND state = 'pending' AND attempts = $3
"""
DEFERRED = f"""
UPDATE webhook_deliveries SET next_attempt_at = {_UNLESS_PARKED.format("$4")}, attempts = attempts - 1
 WHERE id = $1 AND created_at = $2 AND state = 'pending' AND attempts = $3
"""
ENDPOINT_OK = """
UPDATE webhook_endpoints SET failure_streak = 0, failing_since = NULL
 WHERE id = $1 AND failure_streak > 0
"""
# In SET, every column reads its value before this UPDATE.
ENDPOINT_FAILED = """
WITH judged AS (
    SELECT id, failure_streak + 1 AS streak, coalesce(failing_since, now()) AS since,
           enabled AND failure_streak + 1 >= $2
             AND coalesce(failing_since, now()) <= now() - make_interval(secs => $3) AS disable
      FROM webhook_endpoints WHERE id = $1 FOR NO KEY UPDATE  -- waits for no enqueue (but park_queued)
)
UPDATE webhook_endpoints e
   SET failure_streak = j.streak,
       failing_since = j.since,
       enabled = e.enabled AND NOT j.disable,
       disabled_at = CASE WHEN j.disable THEN now() ELSE e.disabled_at END,
       disabled_reason = CASE WHEN j.disable THEN format(
           'disabled by Clarion after %s consecutive failed deliveries since %s; last: %s',
           j.streak, to_char(j.since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), $4::text)
           ELSE e.disabled_reason END
  FROM judged j WHERE e.id = j.id
RETURNING j.disable
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    max_attempts: int
    base_s: float
    max_s: float
    disable_after_failures: int
    disable_after_s: float

    def backoff_s(self, attempts: int, retry_after_s: float | None = None) -> float:
        """Delay after the ``attempts``-th failed call: base doubling to max, jittered over its
        upper half (a burst of failures does not come back as a burst), never under Retry-After."""
        ceiling = min(self.max_s, self.base_s * 2 ** min(attempts - 1, 40))
        delay = random.uniform(ceiling / 2, ceiling)
        return max(delay, min(retry_after_s or 0.0, self.max_s))


async def record_result(
    *, pool: asyncpg.Pool, delivery: ClaimedDelivery, result: CallResult, policy: RetryPolicy
) -> bool:
    """Write ``result`` (one transaction, the endpoint's row locked before the delivery's); returns
    True when this failure disabled the endpoint."""
    key = (delivery.id, delivery.created_at)
    async with pool.acquire() as conn, conn.transaction():
        if result.ok:
            await conn.execute(ENDPOINT_OK, delivery.endpoint_id)
            await _update_ours(conn, DELIVERED, *key, result.status)
            return False
        error = storable(result.error, 500)
        disabled = await conn.fetchval(
            ENDPOINT_FAILED,
            delivery.endpoint_id,
            policy.disable_after_failures,
            policy.disable_after_s,
            error or "unknown error",
        )
        delay_s = policy.backoff_s(delivery.attempts, result.retry_after_s)
        await _update_ours(
            conn, FAILED, *key, delivery.attempts, policy.max_attempts, delay_s, result.status, error
        )
        if disabled:
            await park_queued(conn, endpoint_id=delivery.endpoint_id)
        return bool(disabled)


async def park_queued(conn: asyncpg.Connection, *, endpoint_id: UUID) -> None:
    """Park the endpoint's pending deliveries, those being queued to it now included, as the
    tenant's disable does (``api.webhook_endpoints._settle_pending``), the caller holding the
    endpoint's row already (lock order): the backlog first, then the endpoint ``FOR UPDATE``
    (``LOCK_ENDPOINT``: it waits for every enqueue and replay holding it ``FOR KEY SHARE``, and
    those after it see it disabled and queue nothing), then what they queued.
    Before, the failure that disabled the endpoint parked only what had committed: deliveries a
    worker's record was queueing to it in that instant stayed due for a disabled endpoint."""
    await conn.execute(PARK_PENDING, endpoint_id)
    await conn.execute(LOCK_ENDPOINT, endpoint_id)
    await conn.execute(PARK_PENDING, endpoint_id)


async def record_deferred(*, pool: asyncpg.Pool, delivery: ClaimedDelivery, until: datetime) -> None:
    """The breaker refused the call: try again at ``until``, without spending an attempt."""
    async with pool.acquire() as conn:
        await _update_ours(conn, DEFERRED, delivery.id, delivery.created_at, delivery.attempts, until)


async def _update_ours(conn: asyncpg.Connection, sql: str, *args: object) -> bool:
    """One of the delivery's UPDATEs (keyed by id and ``created_at``, ``args[0:2]``), run again
    once if it matched nothing; whether it wrote the row.

    A day queued before its partition existed lives in ``webhook_deliveries_default`` until the
    upkeep creates the day (``schema.partitions._create_days``: delete from the default, insert
    into the day, attach, under ACCESS EXCLUSIVE on the default). A statement that waited for that
    lock was planned before the day was attached, so it looks for the row only where it was and
    updates nothing: the call's result was lost, the delivery left pending until its lease ended
    and sent again. The next statement is planned after the move committed and finds the row; a
    row no longer this caller's matches neither, and a row moves once (out of the default, never
    again)."""
    for _ in range(2):
        if await conn.execute(sql, *args) != "UPDATE 0":
            return True
    log.info("webhook delivery %s: result not recorded, no longer this caller's", args[0])
    return False
