"""The preference routes take turns (``api/preference_gate.py``): past its tenant's turns, or all
tenants' share, a user-side request is a 429 ``preferences_busy`` with ``Retry-After`` (a page a
person can read on the pages), while another tenant's still gets a turn; a bad token is a 403
before any turn or database work. The service side's (by API key) take turns of a gate of their
own, with the same answer past them, and a burst of an ordinary integration waits for its turns."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import AsyncExitStack, contextmanager
from typing import Any
from uuid import UUID

import httpx
import pytest
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from api.preference_gate import PreferenceGate
from api.tenant_turns import TenantTurns
from harness.services import ApiServer, api_client
from tests.conftest import TenantInfo, make_tenant
from tests.fixtures.answers import assert_error
from tests.fixtures.preferences import internal_id, new_user, one_click, stored_preferences, token_for


@pytest.fixture
def gate(api: ApiServer, monkeypatch: pytest.MonkeyPatch) -> PreferenceGate:
    """The running API's gate, its wait for a turn shortened for the test."""
    gate: PreferenceGate = api.app.state.preference_gate
    monkeypatch.setattr(gate, "wait_s", 0.05)
    monkeypatch.setattr(gate, "one_click_wait_s", 0.05)
    return gate


async def user_of(api: ApiServer, engine: AsyncEngine, tenant: TenantInfo) -> UUID:
    async with api_client(api.url, tenant.key) as client:
        await new_user(client)
    return await internal_id(engine, tenant.id, "u-pref")


@contextmanager
def statements(engine: AsyncEngine) -> Iterator[list[str]]:
    """The SQL ``engine`` (the API's) runs inside the block."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine.sync_engine, "before_cursor_execute", record)


def assert_busy(response: httpx.Response) -> None:
    assert_error(response, 429, "preferences_busy")
    assert response.headers["Retry-After"] == "1"


async def test_past_its_tenants_turns_a_request_is_a_429_and_another_tenant_still_gets_one(
    api: ApiServer, engine: AsyncEngine, tenant: TenantInfo, gate: PreferenceGate
) -> None:
    user_id = await user_of(api, engine, tenant)
    other = await make_tenant(engine)
    theirs = await user_of(api, engine, other)
    unsubscribe = token_for(api.settings, tenant.id, user_id, "unsubscribe", category="news")
    preferences = token_for(api.settings, tenant.id, user_id, "preferences")
    async with AsyncExitStack() as held, api_client(api.url, None) as anonymous:
        assert [await held.enter_async_context(gate.turn(tenant.id)) for _ in range(gate.per_tenant)] == [
            True
        ] * gate.per_tenant
        assert_busy(await anonymous.get("/v1/preferences", params={"token": preferences}))
        change = {"preferences": [{"channel": "sms", "category": "*", "opted_in": False}]}
        assert_busy(await anonymous.post("/v1/preferences", params={"token": preferences}, json=change))
        for path, token in (("/preferences", preferences), ("/v1/unsubscribe", unsubscribe)):
            page = await anonymous.get(path, params={"token": token})
            assert page.status_code == 429 and page.headers["Retry-After"] == "1", path
            assert "text/html" in page.headers["content-type"] and "try again" in page.text.lower(), path
        mine = token_for(api.settings, other.id, theirs, "preferences")
        assert (await anonymous.get("/v1/preferences", params={"token": mine})).status_code == 200
    async with api_client(api.url, None) as anonymous:  # the turns given back: answered again
        assert (await one_click(anonymous, unsubscribe)).status_code == 200
    assert not gate._tenants


async def test_a_one_click_unsubscribe_past_its_tenants_turns_is_recorded_not_refused(
    api: ApiServer, engine: AsyncEngine, tenant: TenantInfo, gate: PreferenceGate
) -> None:
    """A mailbox provider makes the one-click POST once: a 429 there was an unsubscribe lost (a
    review, 2026-11-29). It waits its turn, then runs without one."""
    user_id = await user_of(api, engine, tenant)
    unsubscribe = token_for(api.settings, tenant.id, user_id, "unsubscribe", category="news")
    async with AsyncExitStack() as held, api_client(api.url, None) as anonymous:
        for _ in range(gate.per_tenant):
            assert await held.enter_async_context(gate.turn(tenant.id))

        done = await one_click(anonymous, unsubscribe)

        assert done.status_code == 200, done.text
        assert await stored_preferences(engine, user_id) == [("email", "news", False)]


async def test_with_every_tenants_share_taken_a_request_is_a_429(
    api: ApiServer, engine: AsyncEngine, tenant: TenantInfo, gate: PreferenceGate
) -> None:
    user_id = await user_of(api, engine, tenant)
    token = token_for(api.settings, tenant.id, user_id, "preferences")
    async with AsyncExitStack() as held, api_client(api.url, None) as anonymous:
        n = 0
        while await held.enter_async_context(gate.turn(f"t-elsewhere-{n}")):  # until none is left
            n += 1
        assert n == api.settings.db_pool_size // 2
        assert_busy(await anonymous.get("/v1/preferences", params={"token": token}))


async def test_a_bad_token_is_a_403_with_no_turn_and_no_database_work(
    api: ApiServer, engine: AsyncEngine, tenant: TenantInfo, gate: PreferenceGate
) -> None:
    user_id = await user_of(api, engine, tenant)
    good = token_for(api.settings, tenant.id, user_id, "unsubscribe", category="news")
    payload, _ = good.split(".")
    bad = [f"{payload}.{'A' * 43}", "not-a-token", "x" * 2048, good + "." + good]
    async with AsyncExitStack() as held, api_client(api.url, None) as anonymous:
        for _ in range(gate.per_tenant):  # the tenant the forged tokens name has no turn left
            await held.enter_async_context(gate.turn(tenant.id))
        with statements(api.app.state.engine) as seen:
            for token in bad:
                assert_error(await one_click(anonymous, token), 403, "invalid_token")
                page = await anonymous.get("/preferences", params={"token": token})
                assert page.status_code == 403 and "Link not valid" in page.text
        assert seen == []


# --- by API key ------------------------------------------------------------------------------------

CHANGE = {"preferences": [{"channel": "sms", "category": "*", "opted_in": False}]}


@pytest.fixture
def keyed_gate(api: ApiServer, monkeypatch: pytest.MonkeyPatch) -> TenantTurns:
    """The running API's gate of the keyed preference requests, its wait shortened for the test."""
    gate: TenantTurns = api.app.state.keyed_preference_gate
    monkeypatch.setattr(gate, "wait_s", 0.05)
    return gate


async def test_past_its_tenants_keyed_turns_a_preference_request_is_a_429_before_the_database(
    api: ApiServer, engine: AsyncEngine, tenant: TenantInfo, keyed_gate: TenantTurns
) -> None:
    """40 loops of one tenant's 500-entry writes held the pool another tenant's requests wait on
    (2026-11-29, p99 12-45 ms -> 2.5-3.3 s); past its turns a request takes no connection."""
    other = await make_tenant(engine)
    async with api_client(api.url, tenant.key) as mine, api_client(api.url, other.key) as theirs:
        await new_user(mine)
        await new_user(theirs)
        async with AsyncExitStack() as held:
            for _ in range(keyed_gate.per_tenant):
                assert await held.enter_async_context(keyed_gate.turn(tenant.id))
            with statements(api.app.state.engine) as seen:
                assert_busy(await mine.put("/v1/users/u-pref/preferences", json=CHANGE))
                assert_busy(await mine.get("/v1/users/u-pref/preferences"))
            assert seen == []
            served = await theirs.put("/v1/users/u-pref/preferences", json=CHANGE)
            assert served.status_code == 200, served.text
        again = await mine.put("/v1/users/u-pref/preferences", json=CHANGE)  # the turns given back
        assert again.status_code == 200, again.text
    assert not keyed_gate._tenants


async def test_a_burst_of_an_integrations_preference_writes_waits_for_its_turns_not_refused(
    api: ApiServer, tenant: TenantInfo
) -> None:
    """Ten at once, five times the tenant's turns, with the API's own wait: every one is served."""
    async with api_client(api.url, tenant.key) as client:
        for n in range(10):
            await new_user(client, f"u-burst-{n}")
        answers = await asyncio.gather(
            *(client.put(f"/v1/users/u-burst-{n}/preferences", json=CHANGE) for n in range(10))
        )
    assert [a.status_code for a in answers] == [200] * 10
