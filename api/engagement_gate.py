"""How much of the API's database pool engagement writes may hold: email-tracking hits (the pixel,
a link) and reported opens and clicks (a device's with its push token, a backend's with its key).
At most ``PER_TENANT`` of one tenant's at once in one API process, and at most half the pool for
all tenants' together; each waits at most ``WAIT_S`` for its turn and then ``LOCK_TIMEOUT_MS`` for
its engagement row.

Past that, a tracking hit is still answered (the pixel, the redirect: a person's link must work)
but not recorded, counted in ``clarion_tracking_hits_unrecorded_total``; a report is a ``429
engagement_busy`` with ``Retry-After: 1``. The pixel, the links and a device's reports need no API
key: anyone holding one tracked mail or one push can send them in a loop, and every one of them
updates one engagement row (a replay too: the upsert locks the row it then leaves unchanged). They
queued on its lock, each holding one of the pooled connections the accept path shares. Before
(2026-11-28, a helper's probe, 64 loops in a process of their own): on one pixel, another
tenant's accept p99 went from 18 to 866 ms (max 1.4 s, 130 accepts in 6 s instead of 514); one
device's report replayed, 21 -> 422 ms; a tenant's own keyed report, 21 -> 458 ms (max 1.3 s). The
same loops on a forged token, refused before the database: 47 ms. The turns are
``api.tenant_turns``, shared with ``api.preference_gate``.
"""

from __future__ import annotations

from api.tenant_turns import TenantTurns

PER_TENANT = 2
WAIT_S = 0.5
LOCK_TIMEOUT_MS = 1000


class EngagementGate(TenantTurns):
    """Per-process turns of the engagement writes; lives on ``app.state.engagement_gate``."""

    def __init__(self, *, pool_size: int, per_tenant: int = PER_TENANT, wait_s: float = WAIT_S) -> None:
        super().__init__(pool_size=pool_size, per_tenant=per_tenant, wait_s=wait_s)
