"""Preferences over the API: service side (API key), user side (signed token), categories, tokens."""

from __future__ import annotations

import asyncio
import time
from uuid import UUID, uuid4

import asyncpg
import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy.ext.asyncio import AsyncEngine

from api.preferences import MAX_PREFERENCES_PER_USER
from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from clarion.tokens import InvalidToken, make_token, verify_token
from harness.services import ApiServer, api_client
from tests.conftest import TenantInfo, make_tenant
from tests.fixtures.answers import assert_error
from tests.fixtures.db import scalar
from tests.fixtures.preferences import internal_id, new_user, one_click, stored_preferences, token_for


@pytest.fixture
async def user_id(client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo) -> UUID:
    """The internal id (what tokens carry) of ``u-pref``, created through the API."""
    await new_user(client)
    return await internal_id(engine, tenant.id, "u-pref")


# --- categories and service-side preferences -------------------------------------------------------


async def test_category_is_declared_and_read_back(client: httpx.AsyncClient) -> None:
    created = await client.put("/v1/categories/marketing", json={"default_opted_in": False})
    assert created.status_code == 201, created.text
    changed = await client.put("/v1/categories/marketing", json={"email_quiet_hours": True})
    assert changed.status_code == 200
    read = (await client.get("/v1/categories/marketing")).json()
    assert read == {
        "name": "marketing",
        "default_opted_in": True,
        "required": False,
        "email_quiet_hours": True,
    }
    assert_error(await client.get("/v1/categories/nope"), 404, "unknown_category")
    contradictory = await client.put("/v1/categories/otp", json={"required": True, "default_opted_in": False})
    assert_error(contradictory, 422, "validation_error")


async def test_categories_need_the_admin_scope(api: ApiServer, engine: AsyncEngine) -> None:
    sender = await make_tenant(engine, scopes=("send", "read"))
    async with api_client(api.url, sender.key) as c:
        assert_error(await c.put("/v1/categories/x", json={}), 403, "forbidden")


async def test_preferences_are_replaced_and_effective_view_follows(client: httpx.AsyncClient) -> None:
    await new_user(client)
    await client.put("/v1/categories/news", json={"default_opted_in": False})
    await client.put("/v1/categories/security", json={"required": True})
    before = (await client.get("/v1/users/u-pref/preferences")).json()
    assert before["effective"]["news"] == {"email": False, "sms": False, "push": False}
    assert before["effective"]["security"]["email"] is True

    body = {
        "preferences": [
            {"channel": "*", "category": "news", "opted_in": True},
            {"channel": "sms", "category": "news", "opted_in": False},
            {"channel": "push", "category": "*", "opted_in": False},
        ]
    }
    after = await client.put("/v1/users/u-pref/preferences", json=body)
    assert after.status_code == 200, after.text
    effective = after.json()["effective"]
    assert effective["news"] == {"email": True, "sms": False, "push": True}  # category beats channel
    assert effective["*"] == {"email": True, "sms": True, "push": False}
    assert effective["security"]["push"] is True  # required: never off

    replaced = await client.put(
        "/v1/users/u-pref/preferences",
        json={"preferences": [{"channel": "email", "category": "*", "opted_in": False}]},
    )
    assert replaced.json()["preferences"] == [{"channel": "email", "category": "*", "opted_in": False}]


async def test_required_category_cannot_be_opted_out_of(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    await new_user(client)
    await client.put("/v1/categories/security", json={"required": True})
    body = {
        "preferences": [
            {"channel": "email", "category": "orders", "opted_in": False},
            {"channel": "email", "category": "security", "opted_in": False},
        ]
    }
    error = assert_error(
        await client.put("/v1/users/u-pref/preferences", json=body), 422, "category_required"
    )
    assert error["details"] == {"categories": ["security"]}
    assert await stored_preferences(engine, await internal_id(engine, tenant.id, "u-pref")) == []


@pytest.mark.parametrize(
    "entry",
    [
        {"channel": "fax", "category": "news", "opted_in": False},
        {"channel": "email", "category": "bad name!", "opted_in": False},
        {"channel": "email", "category": "news"},
    ],
)
async def test_malformed_preferences_are_refused(client: httpx.AsyncClient, entry: dict[str, object]) -> None:
    await new_user(client)
    response = await client.put("/v1/users/u-pref/preferences", json={"preferences": [entry]})
    assert_error(response, 422, "validation_error")


async def test_preferences_of_unknown_user_are_404(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/users/ghost/preferences"), 404, "unknown_user")


# --- user side ---------------------------------------------------------------------------------------


async def test_link_gives_the_user_their_preferences_without_an_api_key(
    client: httpx.AsyncClient, api: ApiServer
) -> None:
    await new_user(client)
    link = (await client.post("/v1/users/u-pref/preferences/link")).json()
    assert link["url"].startswith(f"{api.url}/preferences?token=")
    async with api_client(api.url, None) as anonymous:
        page = await anonymous.get("/preferences", params={"token": link["token"]})
        assert page.status_code == 200 and "Notification preferences" in page.text
        assert page.headers["referrer-policy"] == "no-referrer"
        changed = await anonymous.post(
            "/v1/preferences",
            params={"token": link["token"]},
            json={"preferences": [{"channel": "sms", "category": "*", "opted_in": False}]},
        )
        assert changed.status_code == 200, changed.text
        assert changed.json()["effective"]["*"]["sms"] is False
    service_view = (await client.get("/v1/users/u-pref/preferences")).json()
    assert service_view["preferences"] == [{"channel": "sms", "category": "*", "opted_in": False}]


async def test_a_users_preferences_are_capped_whoever_adds_them(
    client: httpx.AsyncClient, api: ApiServer, tenant: TenantInfo, engine: AsyncEngine
) -> None:
    # The merges were unbounded: a helper grew one user to 50,000 choices through the anonymous
    # link, 500 a request, and every answer carried them all (3.55 MB, 0.55 s).
    await new_user(client)
    token = (await client.post("/v1/users/u-pref/preferences/link")).json()["token"]

    def page(n: int) -> dict[str, object]:
        return {
            "preferences": [
                {"channel": "email", "category": f"c{n}x{i}", "opted_in": False} for i in range(500)
            ]
        }

    async with api_client(api.url, None) as anonymous:
        for n in range(MAX_PREFERENCES_PER_USER // 500):
            answer = await anonymous.post("/v1/preferences", params={"token": token}, json=page(n))
            assert answer.status_code == 200, answer.text
        refused = await anonymous.post("/v1/preferences", params={"token": token}, json=page(99))
        assert_error(refused, 409, "limit_reached")
    held = (await client.get("/v1/users/u-pref/preferences")).json()["preferences"]
    assert len(held) == MAX_PREFERENCES_PER_USER  # nothing of a refused request was kept
    # A full set never blocks a one-click unsubscribe (RFC 8058), and changes that do not grow it
    # still go through.
    user_id = await internal_id(engine, tenant.id, "u-pref")
    unsubscribe = token_for(api.settings, tenant.id, user_id, "unsubscribe", category="brand-new")
    async with api_client(api.url, None) as anonymous:
        done = await one_click(anonymous, unsubscribe)
        assert done.status_code == 200, done.text
        again = {"preferences": [{"channel": "email", "category": "c0x0", "opted_in": True}]}
        assert (
            await anonymous.post("/v1/preferences", params={"token": token}, json=again)
        ).status_code == 200
    replaced = await client.put(
        "/v1/users/u-pref/preferences",
        json={"preferences": [{"channel": "*", "category": "*", "opted_in": True}]},
    )
    assert replaced.status_code == 200 and len(replaced.json()["preferences"]) == 1


async def test_one_click_unsubscribe_is_idempotent_and_get_changes_nothing(
    user_id: UUID, api: ApiServer, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    token = token_for(api.settings, tenant.id, user_id, "unsubscribe", category="news")
    async with api_client(api.url, None) as anonymous:
        opened = await anonymous.get("/v1/unsubscribe", params={"token": token})
        # A page posting the same token: the link keeps its reach (one category, never the whole
        # preference page with a fresh 60-day token).
        assert opened.status_code == 200 and "news" in opened.text
        assert f"/v1/unsubscribe?token={token}" in opened.text and "/preferences?token=" not in opened.text
        assert await stored_preferences(engine, user_id) == []
        for _ in range(2):
            response = await one_click(anonymous, token)
            assert response.status_code == 200, response.text
    assert await stored_preferences(engine, user_id) == [("email", "news", False)]


async def test_a_replayed_unsubscribe_neither_writes_nor_waits_for_the_users_lock(
    user_id: UUID, api: ApiServer, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    """A link replayed in a loop took the user's lock and rewrote their row every time; now a
    repeat is one read. Here the lock and the row are held by another transaction: the replay is
    still answered, and the row is left as it was."""
    token = token_for(api.settings, tenant.id, user_id, "unsubscribe", category="news")
    async with api_client(api.url, None) as anonymous:
        assert (await one_click(anonymous, token)).status_code == 200
        written = await scalar(engine, "SELECT updated_at FROM preferences WHERE user_id = :u", u=user_id)
        locker = await asyncpg.connect(asyncpg_dsn(api.settings.database_url))
        try:
            await locker.execute("BEGIN")
            await locker.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended('preferences:' || $1, 0))", str(user_id)
            )
            await locker.execute("SELECT 1 FROM preferences WHERE user_id = $1 FOR UPDATE", user_id)
            replay = await asyncio.wait_for(one_click(anonymous, token), 10)  # hangs while locked, before
        finally:
            await locker.close()
    assert replay.status_code == 200 and replay.json()["category"] == "news", replay.text
    assert await scalar(engine, "SELECT updated_at FROM preferences WHERE user_id = :u", u=user_id) == written
    assert await stored_preferences(engine, user_id) == [("email", "news", False)]


async def test_a_replayed_unsubscribe_of_an_unknown_user_or_required_category_is_refused(
    client: httpx.AsyncClient, user_id: UUID, api: ApiServer, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    required = await client.put("/v1/categories/security", json={"required": True})
    assert required.status_code == 201, required.text
    async with api_client(api.url, None) as anonymous:
        for _ in range(2):
            security = token_for(api.settings, tenant.id, user_id, "unsubscribe", category="security")
            assert_error(await one_click(anonymous, security), 422, "category_required")
        stranger = token_for(api.settings, tenant.id, uuid4(), "unsubscribe", category="news")
        for _ in range(2):
            assert_error(await one_click(anonymous, stranger), 403, "invalid_token")
    assert await stored_preferences(engine, user_id) == []


async def test_forged_expired_or_misused_tokens_are_403_and_change_nothing(
    user_id: UUID, api: ApiServer, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    good = token_for(api.settings, tenant.id, user_id, "unsubscribe", category="news")
    payload, signature = good.split(".")
    other = await make_tenant(engine)
    bad_tokens = {
        "tampered signature": f"{payload}.{signature[:-2]}AA",
        "other secret": make_token(
            secret="not-the-secret",
            tenant_id=tenant.id,
            user_id=user_id,
            purpose="unsubscribe",
            category="news",
            ttl_s=600,
        ),
        "expired": token_for(api.settings, tenant.id, user_id, "unsubscribe", category="news", ttl_s=-1),
        "preferences token": token_for(api.settings, tenant.id, user_id, "preferences"),
        "other tenant": token_for(api.settings, other.id, user_id, "unsubscribe", category="news"),
        "garbage": "not-a-token",
        "empty": "",
    }
    async with api_client(api.url, None) as anonymous:
        for why, token in bad_tokens.items():
            response = await anonymous.post("/v1/unsubscribe", params={"token": token})
            assert response.status_code == 403, why
            assert response.json()["error"]["code"] == "invalid_token", why
        assert_error(await anonymous.post("/v1/unsubscribe"), 403, "invalid_token")
        assert_error(await anonymous.get("/v1/preferences", params={"token": good}), 403, "invalid_token")
        page = await anonymous.get("/preferences", params={"token": bad_tokens["expired"]})
        assert page.status_code == 403 and "Link not valid" in page.text
    assert await stored_preferences(engine, user_id) == []


async def test_tokens_signed_with_a_previous_secret_still_work_after_rotation(
    settings: Settings, engine: AsyncEngine
) -> None:
    rotated = settings.model_copy(
        update={"secret_key": SecretStr("new-secret"), "previous_secret_keys": [SecretStr("old-secret")]}
    )
    server = ApiServer(rotated)
    await server.start()
    try:
        tenant = await make_tenant(engine)
        async with api_client(server.url, tenant.key) as c:
            await new_user(c)
        user_id = await internal_id(engine, tenant.id, "u-pref")
        async with api_client(server.url, None) as anonymous:
            for secret, status in (("old-secret", 200), ("new-secret", 200), ("older-secret", 403)):
                token = make_token(
                    secret=secret, tenant_id=tenant.id, user_id=user_id, purpose="preferences", ttl_s=600
                )
                response = await anonymous.get("/v1/preferences", params={"token": token})
                assert response.status_code == status, (secret, response.text)
    finally:
        await server.stop()


def test_token_round_trip_and_expiry() -> None:
    user = UUID("01890000-0000-7000-8000-000000000001")
    now = time.time()
    token = make_token(
        secret="s", tenant_id="t", user_id=user, purpose="unsubscribe", category="news", ttl_s=60, now_s=now
    )
    claims = verify_token(token, secrets=["s"], purposes={"unsubscribe"}, now_s=now + 59)
    assert (claims.tenant_id, claims.user_id, claims.category) == ("t", user, "news")
    with pytest.raises(InvalidToken):
        verify_token(token, secrets=["s"], purposes={"unsubscribe"}, now_s=now + 61)
    with pytest.raises(InvalidToken):
        verify_token(token, secrets=["s"], purposes={"preferences"}, now_s=now)
    with pytest.raises(ValueError):
        make_token(secret="s", tenant_id="t", user_id=user, purpose="unsubscribe", ttl_s=60)
