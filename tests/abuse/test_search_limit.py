"""A tenant's searches of its log (and its analytics reads) hold at most their share of the database: a few at once, counted across every API
process on the database (429 ``too_many_searches`` past it) and each for at most the search timeout (422
``search_too_broad``), so one tenant's broad searches cannot slow another tenant's sends.

The searches are held in the database for real: another connection takes an ``ACCESS EXCLUSIVE``
lock on ``users``, which every search joins, and on ``analytics_hourly``, which every analytics
read reads, so they wait inside PostgreSQL as a long scan would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from harness.services import ApiServer, api_client, wait_until
from tests.conftest import make_tenant
from tests.fixtures.answers import assert_error

SHARE = 2


async def _limited_api(settings: Settings, timeout_s: float) -> ApiServer:
    server = ApiServer(
        settings.model_copy(update={"search_concurrency_per_tenant": SHARE, "search_timeout_s": timeout_s})
    )
    await server.start()
    return server


@pytest.fixture
async def users_locked(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A connection holding ``users`` exclusively until the test rolls it back (or ends)."""
    conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
    try:
        yield conn
    finally:
        if conn.is_in_transaction():
            await conn.execute("ROLLBACK")
        await conn.close()


async def _lock(conn: asyncpg.Connection) -> None:
    await conn.execute("BEGIN")
    await conn.execute("LOCK TABLE users, analytics_hourly IN ACCESS EXCLUSIVE MODE")


def _search(client: httpx.AsyncClient) -> Awaitable[httpx.Response]:
    return client.get("/v1/notifications", params={"status": "dead"})


async def test_searches_past_a_tenants_share_are_a_429_and_another_tenant_still_searches(
    settings: Settings, engine: AsyncEngine, users_locked: asyncpg.Connection
) -> None:
    api = await _limited_api(settings, timeout_s=60)
    a, b = await make_tenant(engine), await make_tenant(engine)
    searches = api.app.state.searches
    try:
        async with api_client(api.url, a.key) as ca, api_client(api.url, b.key) as cb:
            assert (await ca.get("/v1/notifications")).status_code == 200  # keys cached before the lock
            assert (await cb.get("/v1/notifications")).status_code == 200
            await _lock(users_locked)
            held = [asyncio.create_task(_search(ca)) for _ in range(SHARE)]
            await wait_until(lambda: searches.running(a.id) == SHARE, interval_s=0.01)

            refused = await _search(ca)
            assert_error(refused, 429, "too_many_searches")
            assert refused.headers["Retry-After"] == "1"
            dead_letters = await ca.get("/v1/ops/dlq/email", params={"error_code": "none"})
            assert_error(dead_letters, 429, "too_many_searches")  # the same share
            assert_error(await ca.get("/v1/analytics"), 429, "too_many_searches")  # and the analytics

            other = asyncio.create_task(_search(cb))  # admitted: the share is per tenant
            await wait_until(lambda: searches.running(b.id) == 1, interval_s=0.01)
            assert not other.done() and not any(t.done() for t in held)

            await users_locked.execute("ROLLBACK")
            answers = await asyncio.gather(*held, other)
            assert [r.status_code for r in answers] == [200] * (SHARE + 1)
            assert searches.running(a.id) == searches.running(b.id) == 0
            assert (await _search(ca)).status_code == 200
    finally:
        await api.stop()


async def _waiting_on_the_lock(engine: AsyncEngine, count: int) -> bool:
    """``count`` searches of this database wait on the locked table (past taking their slots)."""
    async with engine.connect() as conn:
        waiting = await conn.exec_driver_sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return waiting.scalar_one() == count


async def test_the_share_holds_across_api_processes_on_one_database(
    settings: Settings, engine: AsyncEngine, users_locked: asyncpg.Connection
) -> None:
    """Before, each process counted its own: two processes let a tenant run twice its share."""
    first, second = await _limited_api(settings, timeout_s=60), await _limited_api(settings, timeout_s=60)
    a, b = await make_tenant(engine), await make_tenant(engine)
    try:
        async with (
            api_client(first.url, a.key) as a_first,
            api_client(second.url, a.key) as a_second,
            api_client(second.url, b.key) as b_second,
        ):
            for client in (a_first, a_second, b_second):
                assert (await client.get("/v1/notifications")).status_code == 200  # keys cached
            await _lock(users_locked)
            held = [asyncio.create_task(_search(a_first)) for _ in range(SHARE)]
            await wait_until(lambda: _waiting_on_the_lock(engine, SHARE), interval_s=0.01)

            assert_error(await _search(a_second), 429, "too_many_searches")
            assert_error(await a_second.get("/v1/analytics"), 429, "too_many_searches")
            other = asyncio.create_task(_search(b_second))  # another tenant's share is its own
            await wait_until(lambda: second.app.state.searches.running(b.id) == 1, interval_s=0.01)
            assert not other.done()

            await users_locked.execute("ROLLBACK")
            answers = await asyncio.gather(*held, other)
            assert [r.status_code for r in answers] == [200] * (SHARE + 1)
            assert (await _search(a_second)).status_code == 200  # the slots went with their transactions
    finally:
        await first.stop()
        await second.stop()


async def test_a_search_past_the_timeout_is_a_422_and_frees_its_slot(
    settings: Settings, engine: AsyncEngine, users_locked: asyncpg.Connection
) -> None:
    api = await _limited_api(settings, timeout_s=0.2)
    a = await make_tenant(engine)
    try:
        async with api_client(api.url, a.key) as ca:
            assert (await ca.get("/v1/notifications")).status_code == 200
            await _lock(users_locked)
            for _ in range(SHARE + 1):  # each one's slot is given back: none is refused as too many
                assert_error(await ca.get("/v1/notifications"), 422, "search_too_broad")
                assert_error(await ca.get("/v1/analytics"), 422, "search_too_broad")
            assert api.app.state.searches.running(a.id) == 0
            await users_locked.execute("ROLLBACK")
            assert (await ca.get("/v1/notifications")).status_code == 200
    finally:
        await api.stop()
