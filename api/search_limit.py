"""How much of the database one tenant's searches of its log (``GET /v1/notifications``, and its
dead letters at ``GET /v1/ops/dlq/{channel}``) may hold: at most
``CLARION_SEARCH_CONCURRENCY_PER_TENANT`` searches at once, however many API processes serve it,
each for at most
``CLARION_SEARCH_TIMEOUT_S`` of PostgreSQL time.

A search reads the tenant's rows newest first and filters by status, channel or user on the way
(by the ``(tenant_id, created_at)`` index, or a parallel scan of each day's partition). A filter
that matches few rows reads every row of the tenant inside the range: for a status the tenant has
none of, 0.3-0.68 s at 1 M rows, and sixteen such searches at once slowed another tenant's send
from 5 to 424 ms (2026-11-28, a fuzzing helper). With the bound, sixteen search loops of one
tenant slowed another's accept p50 from ~5 to 27 ms, against 81-115 ms without it (two runs each).
An index per filter would cost every send an index entry per status change; the bound costs the
send path nothing and grows with nothing: a tenant holds at most its share of backends, each for
at most the timeout, whatever its row count.

The share holds across every API process on the database, not only within one: ``clarion api
--workers N`` and replicas each counted their own, so a tenant ran N times its share (the note of
2026-11-28). A search first takes a turn in its process (no connection is taken past it), then one
of the tenant's ``per_tenant`` slots in PostgreSQL: a transaction-scoped advisory lock, tried in
the same round trip that sets the time bound, never waited for, let go with the transaction.

Errors (``ApiError``)::

    429 too_many_searches   the tenant already runs its share of searches, in this API process or
                            in all of them (``Retry-After: 1``)
    422 search_too_broad    the search read for longer than the timeout: narrow it with
                            ``since``/``until`` or ``user``
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.errors import ApiError

QUERY_CANCELED = "57014"  # PostgreSQL's SQLSTATE for a statement stopped by statement_timeout

# The time bound and the first free slot of the tenant's share, in one round trip. Each slot is a
# transaction-scoped advisory lock keyed as api/caps.py keys its own; a slot held elsewhere is
# skipped (try, never wait), and LIMIT 1 stops at the first one taken, so at most one is held.
TAKE_SLOT = sa.text("""
SELECT set_config('statement_timeout', :timeout_ms, true),
       (SELECT slot FROM generate_series(0, :share - 1) AS slot
         WHERE pg_try_advisory_xact_lock(hashtextextended('search:' || :tenant || ':' || slot, 0))
         LIMIT 1)
""")


class SearchLimit:
    """Per-process gate of the log searches; lives on ``app.state.searches``."""

    def __init__(self, *, per_tenant: int, timeout_s: float) -> None:
        self.per_tenant = per_tenant
        self.timeout_ms = max(1, round(timeout_s * 1000))
        self._running: Counter[str] = Counter()

    def running(self, tenant_id: str) -> int:
        return self._running[tenant_id]

    @asynccontextmanager
    async def connect(self, *, engine: AsyncEngine, tenant_id: str) -> AsyncIterator[AsyncConnection]:
        """A connection for one of ``tenant_id``'s searches, in a transaction whose statements stop
        after the timeout. A search past the tenant's share is refused before it takes a pooled
        connection: a tenant retrying its 429s at once (2,600 in 20 s) cost another tenant's accept
        2x more than no bound at all while each refusal took one and pinged it first."""
        if self._running[tenant_id] >= self.per_tenant:
            raise self._too_many()
        self._running[tenant_id] += 1
        try:
            async with engine.connect() as conn:
                bound = {"timeout_ms": str(self.timeout_ms), "share": self.per_tenant, "tenant": tenant_id}
                if (await conn.execute(TAKE_SLOT, bound)).one()[1] is None:
                    raise self._too_many()  # the share is taken by the tenant's searches elsewhere
                yield conn
        except DBAPIError as exc:
            if getattr(exc.orig, "sqlstate", None) != QUERY_CANCELED:
                raise
            raise ApiError(
                422,
                "search_too_broad",
                f"The search read for more than {self.timeout_ms} ms; narrow it with since/until or user.",
            ) from exc
        finally:
            self._running[tenant_id] -= 1
            if not self._running[tenant_id]:
                del self._running[tenant_id]

    def _too_many(self) -> ApiError:
        return ApiError(
            429,
            "too_many_searches",
            f"This tenant already runs {self.per_tenant} searches at once; retry when one is done.",
            headers={"Retry-After": "1"},
        )
