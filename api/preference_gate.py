"""How much of the API's database pool a tenant's preference requests may hold: a person's
user-side ones, the preference page and its data (``/preferences``, ``GET/POST
/v1/preferences?token=``) and the unsubscribe link (``GET`` and RFC 8058's one-click ``POST
/v1/unsubscribe?token=``); and the tenant's own by API key (``GET/PUT
/v1/users/{external_id}/preferences``, see "By API key" below).

These need no API key, only a signed token from one email, so anyone holding one can send them in
a loop. The token is checked first, without the database and without a turn; then at most
``PER_TENANT`` of the tenant it names run at once in one API process, and at most half the pool
for all tenants' together (``api.tenant_turns``, as ``api.engagement_gate``), each waiting at most
``WAIT_S`` for its turn.

RFC 8058's one-click ``POST /v1/unsubscribe`` is never refused as busy: a mailbox provider makes
that POST once and is not known to retry it, so a 429 there was an unsubscribe lost (a review,
2026-11-29: 0-47 of ~1,500 answers a phase were 429s under the flood). It waits up to
``ONE_CLICK_WAIT_S`` for a turn and then runs without one. What runs so is bounded by the wait
itself: a loop of requests gets at most one through every ``ONE_CLICK_WAIT_S`` (64 loops, about 13
a second), and each is one read when it repeats an unsubscribe (``api.preferences.unsubscribe``).

Error tree (JSON routes: the error body; pages: the same status as an HTML page):

    403 invalid_token      forged, expired, malformed or misused token; no turn, no database
    429 preferences_busy   no turn within ``WAIT_S`` (never for the one-click POST), or for a
                           keyed request within ``KEYED_WAIT_S``; ``Retry-After: 1``

Before (2026-11-29, ``python -m bench.anonymous_flood``, 64 loops in a process of their own, 2
cores shared with other suites): another tenant's accept p99 37 ms alone went to 1,357 ms under
distinct valid unsubscribes (57 answered a second: each held a pooled connection for a dozen
statements, and the API's event loop, not PostgreSQL, was the bottleneck: py-spy, 87% busy, two
thirds of it in SQLAlchemy and asyncpg for those statements; pg_stat_activity showed the
connections idle in transaction, waiting for the API), to 138 ms under preference-page reads,
and to 254-791 ms under forged tokens (3,000-3,600 answered a second, every one a 403 before
the database: the cost there is the HTTP stack, routing and middlewares, not the token check,
3% of the samples).

After, with a repeated unsubscribe made one read (``api.preferences.unsubscribe``) and forged
tokens refused before the router (``api.token_first``), A/B/B/A against f09e5a3 (two runs each,
8 s phases, p99 of the other tenant's accepts, original / this): distinct valid unsubscribes
117-319 / 23-32 ms, one replayed 36-74 / 14-38, preference reads 86-282 / 16-19, one replayed
62-104 / 17-25, forged unsubscribe tokens 216-317 / 56-72, forged preference tokens 146-376 /
51-80; alone 9-21 / 9-17 ms. The flood is not starved: 143-221 valid unsubscribes a second either
way, and 395-578 replays against 109-160. Most of the 64 loops wait for a turn, and few wait past ``WAIT_S``
(0-47 429s of ~1,500 answers a phase). The gate alone did nothing for forged tokens (551 and
345 ms in one run): that is ``api.token_first``'s.

By API key: a tenant's preference reads and writes take turns of a gate of their own
(``app.state.keyed_preference_gate``, so a tenant's integration never takes its users' turns on
their preference page), ``CLARION_PREFERENCE_REQUESTS_PER_TENANT`` at once in one API process and
half the pool for all tenants', before taking a connection; each waits up to ``KEYED_WAIT_S`` (an
integration's burst queues and is served) and is a 429 past it. Before (2026-11-29, a helper's
probe, 40 loops of one tenant's 500-entry ``PUT``, on one user or on 40): each write held a pooled
connection while it waited for the user's lock or the event loop, and the loops took the pool;
another tenant's ``PUT /v1/users`` p99 went from 22-53 ms alone to 3.9-7.5 s on one user and
4.5-7.9 s on 40 (40 loops of ``GET /v1/users/{id}``, the control: 585-784 ms). After, with the
write also made cheaper (``api.preferences``), A/B/B/A against 9880f06: 107 ms on one user,
233-508 ms on 40, the control 411-457 ms, alone 25-30 ms.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from api.errors import ApiError
from api.preference_links import verified_claims
from api.tenant_turns import TenantTurns
from clarion.settings import Settings
from clarion.tokens import TokenClaims

PER_TENANT = 2
WAIT_S = 0.5
ONE_CLICK_WAIT_S = 5.0  # well inside the 10-30 s a sender's HTTP client commonly waits
KEYED_WAIT_S = 2.0
USER_SIDE_BUSY = "Too many requests for this sender's preference links right now; try again in a moment."
KEYED_BUSY = "This tenant's preference requests already hold their share of the API; retry after Retry-After."


class PreferenceGate(TenantTurns):
    """Per-process turns of the user-side preference requests; lives on ``app.state.preference_gate``."""

    def __init__(
        self,
        *,
        pool_size: int,
        per_tenant: int = PER_TENANT,
        wait_s: float = WAIT_S,
        one_click_wait_s: float = ONE_CLICK_WAIT_S,
    ) -> None:
        super().__init__(pool_size=pool_size, per_tenant=per_tenant, wait_s=wait_s)
        self.one_click_wait_s = one_click_wait_s


def busy(message: str = USER_SIDE_BUSY) -> ApiError:
    return ApiError(429, "preferences_busy", message, headers={"Retry-After": "1"})


def keyed_gate(*, pool_size: int, per_tenant: int) -> TenantTurns:
    """The turns of the preference requests by API key; lives on ``app.state.keyed_preference_gate``."""
    return TenantTurns(pool_size=pool_size, per_tenant=per_tenant, wait_s=KEYED_WAIT_S)


@asynccontextmanager
async def keyed_turn(*, gate: TenantTurns, tenant_id: str) -> AsyncIterator[None]:
    """While the key's tenant holds a turn of its preference requests; ``429 preferences_busy``
    when none came within the gate's wait, before any database work."""
    async with gate.turn(tenant_id) as mine:
        if not mine:
            raise busy(KEYED_BUSY)
        yield


@asynccontextmanager
async def user_side_turn(
    *,
    gate: PreferenceGate,
    settings: Settings,
    token: str | None,
    purposes: set[str],
    one_click: bool = False,
) -> AsyncIterator[TokenClaims]:
    """The token's verified claims, while its tenant holds a turn; ``403 invalid_token`` before
    any turn or database work, ``429 preferences_busy`` when no turn came, but for ``one_click``,
    which runs without one after ``gate.one_click_wait_s``."""
    claims = verified_claims(settings=settings, token=token, purposes=purposes)
    wait_s = gate.one_click_wait_s if one_click else None
    async with gate.turn(claims.tenant_id, wait_s=wait_s) as mine:
        if not mine and not one_click:
            raise busy()
        yield claims
