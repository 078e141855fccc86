"""A tenant's rules, templates, categories, API keys and each user's active devices are capped
(every process loads every tenant's rules; a push fans out to a user's devices on the shared
worker), and the rate-limit metrics are labelled by scope, so one tenant cannot slow or flood
everyone else."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.rate_limits import MAX_RECIPIENT_RULES
from clarion.rules import RuleSpec
from clarion.settings import Settings
from core.devices import MAX_ACTIVE_DEVICES, MAX_INACTIVE_DEVICES, MAX_TOKEN_CHARS
from harness.services import ApiServer, api_client
from tests.conftest import make_tenant
from tests.fixtures.answers import refused

CAP = 3


@pytest.fixture
async def capped_api(settings: Settings) -> AsyncIterator[ApiServer]:
    server = ApiServer(
        settings.model_copy(
            update={
                "max_rules_per_tenant": CAP,
                "max_templates_per_tenant": CAP,
                "max_categories_per_tenant": CAP,
                "max_api_keys_per_tenant": CAP,
            }
        )
    )
    await server.start()
    yield server
    await server.stop()


def rule(n: int) -> dict[str, object]:
    return {"name": f"cap-{n}", "scope": "recipient", "channel": "sms", "limit": 5, "period_s": 60}


def template(n: int) -> dict[str, object]:
    return {"name": f"t{n}", "channel": "sms", "body": "Hello {{ name }}", "sample_data": {"name": "x"}}


async def test_rules_past_the_cap_are_a_409_and_another_tenant_is_unaffected(
    capped_api: ApiServer, engine: AsyncEngine
) -> None:
    mallory, alice = await make_tenant(engine), await make_tenant(engine)
    async with api_client(capped_api.url, mallory.key) as m, api_client(capped_api.url, alice.key) as a:
        for n in range(CAP):
            assert (await m.post("/v1/rate-limits", json=rule(n))).status_code == 201
        error = refused(await m.post("/v1/rate-limits", json=rule(99)), 409)
        assert error["code"] == "limit_reached"
        assert len((await m.get("/v1/rate-limits")).json()) == CAP
        assert (await a.post("/v1/rate-limits", json=rule(0))).status_code == 201


async def test_recipient_rules_past_their_own_cap_are_a_409_on_create_and_on_replace(
    client: httpx.AsyncClient,
) -> None:
    # Each keeps a limiter key per recipient for its period: 100 of them made ~20 KB of the shared
    # Redis per send, kept a month (2026-11-28, a helper's probe).
    for n in range(MAX_RECIPIENT_RULES):
        assert (await client.post("/v1/rate-limits", json=rule(n))).status_code == 201
    assert refused(await client.post("/v1/rate-limits", json=rule(99)), 409)["code"] == "limit_reached"
    pacing = {
        "name": "p",
        "scope": "provider",
        "channel": "sms",
        "provider": "sandbox",
        "limit": 5,
        "period_s": 1,
    }
    other = await client.post("/v1/rate-limits", json=pacing)
    assert other.status_code == 201, other.text  # other scopes are not held by this cap
    replaced = await client.put(f"/v1/rate-limits/{other.json()['id']}", json=rule(98))
    assert refused(replaced, 409)["code"] == "limit_reached"
    assert (await client.get(f"/v1/rate-limits/{other.json()['id']}")).json()["scope"] == "provider"


async def test_templates_past_the_cap_are_a_409(capped_api: ApiServer, engine: AsyncEngine) -> None:
    mallory = await make_tenant(engine)  # starts with the shipped default templates
    async with api_client(capped_api.url, mallory.key) as m:
        held = len((await m.get("/v1/templates")).json())
        assert held >= CAP, "the shipped default templates should already fill the test's cap"
        response = await m.post("/v1/templates", json=template(0))
        assert refused(response, 409)["code"] == "limit_reached"
        assert len((await m.get("/v1/templates")).json()) == held


def test_a_tenant_rule_is_labelled_by_its_scope_and_a_global_one_by_its_name() -> None:
    fields = dict(channel=None, category=None, provider="sandbox", limit=5, period_s=1.0, burst=0,
                  mode="hard", overshoot_pct=0.0, action="delay")  # fmt: skip
    tenant_rule = RuleSpec(id=1, tenant_id="t-1", name="name-chosen-by-a-tenant", scope="provider", **fields)
    global_rule = RuleSpec(id=2, tenant_id=None, name="sendgrid-pace", scope="provider", **fields)
    assert tenant_rule.metric_label == "tenant:provider"
    assert global_rule.metric_label == "sendgrid-pace"
    assert tenant_rule.to_rule().rule_id == "tenant:provider"  # the fail-open counter's label too


async def test_categories_past_the_cap_are_a_409_but_a_declared_one_still_changes(
    capped_api: ApiServer, engine: AsyncEngine
) -> None:
    mallory = await make_tenant(engine)
    async with api_client(capped_api.url, mallory.key) as m:
        held = len((await m.get("/v1/categories")).json())
        for n in range(CAP - held):
            assert (await m.put(f"/v1/categories/c{n}", json={})).status_code == 201
        assert refused(await m.put("/v1/categories/one-more", json={}), 409)["code"] == "limit_reached"
        names = [c["name"] for c in (await m.get("/v1/categories")).json()]
        assert len(names) == CAP
        again = await m.put(f"/v1/categories/{names[0]}", json={"email_quiet_hours": True})
        assert again.status_code == 200 and again.json()["email_quiet_hours"] is True


async def test_unrevoked_keys_past_the_cap_are_a_409_until_one_is_revoked(
    capped_api: ApiServer, engine: AsyncEngine
) -> None:
    mallory = await make_tenant(engine)  # holds one key: the one this test uses
    async with api_client(capped_api.url, mallory.key) as m:
        made = [await m.post("/v1/keys", json={"name": f"k{n}", "scopes": ["send"]}) for n in range(CAP - 1)]
        assert [r.status_code for r in made] == [201] * (CAP - 1)
        assert refused(await m.post("/v1/keys", json={"name": "x", "scopes": ["send"]}), 409)["code"] == (
            "limit_reached"
        )
        assert (await m.post(f"/v1/keys/{made[0].json()['id']}/revoke")).status_code == 200
        assert (await m.post("/v1/keys", json={"name": "y", "scopes": ["send"]})).status_code == 201


async def test_a_user_keeps_the_newest_active_devices_and_a_bounded_list(client: httpx.AsyncClient) -> None:
    tokens = [f"{n:04d}" + "b" * 60 for n in range(MAX_ACTIVE_DEVICES + 3)]
    assert (await client.put("/v1/users/u-phones", json={})).status_code == 201
    for token in tokens:
        response = await client.post("/v1/users/u-phones/devices", json={"platform": "apns", "token": token})
        assert response.status_code == 201, response.text
    devices = (await client.get("/v1/users/u-phones")).json()["devices"]
    assert [d["token"] for d in devices] == tokens  # oldest first, all of them: under the list's bound
    active = [d["token"] for d in devices if d["active"]]
    assert active == tokens[3:]
    assert all("retired" in d["last_error"] for d in devices[:3])

    # The first, retired, registered again: it is the newest now, and the cap retires the next oldest.
    revived = await client.post("/v1/users/u-phones/devices", json={"platform": "apns", "token": tokens[0]})
    assert revived.status_code == 200 and revived.json()["active"], revived.text
    devices = (await client.get("/v1/users/u-phones")).json()["devices"]
    assert [d["token"] for d in devices if d["active"]] == [*tokens[4:], tokens[0]]


async def test_devices_carried_inline_by_sends_keep_the_same_bound(client: httpx.AsyncClient) -> None:
    tokens = [f"{n:064x}" for n in range(1, 2 * 30 + 1)]
    for batch in (tokens[:30], tokens[30:]):
        send = {
            "event_id": f"evt-{batch[0][-6:]}", "channel": "push", "content": {"title": "t", "body": "b"},
            "user": {"id": "u-inline", "devices": [{"platform": "apns", "token": t} for t in batch]},
        }  # fmt: skip
        assert (await client.post("/v1/notifications", json=send)).status_code == 202
    devices = (await client.get("/v1/users/u-inline")).json()["devices"]
    assert sum(d["active"] for d in devices) == MAX_ACTIVE_DEVICES
    # The second send's 30 are the newest, all kept; 20 of the first send's 30 are (one statement
    # wrote those 30 at one time, so which 20 is not defined).
    assert {d["token"] for d in devices if d["active"]} >= set(tokens[30:])


async def test_a_users_retired_devices_are_bounded_too(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    # Before 2026-11-28 every retired row stayed: a helper gave one user 12,200 rows, and every
    # accept checking that user's devices read them all inside the transaction tenants share.
    registered = MAX_ACTIVE_DEVICES + MAX_INACTIVE_DEVICES + 40
    tokens = [f"{n:064x}" for n in range(1, registered + 1)]
    assert (await client.put("/v1/users/u-churn", json={})).status_code == 201
    for token in tokens:
        response = await client.post("/v1/users/u-churn/devices", json={"platform": "apns", "token": token})
        assert response.status_code == 201, response.text
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.text(
                    "SELECT d.active, count(*) FROM devices d JOIN users u ON u.id = d.user_id"
                    " WHERE u.external_id = 'u-churn' GROUP BY d.active"
                )
            )
        ).all()
    counts = {active: n for active, n in rows}
    assert counts[True] == MAX_ACTIVE_DEVICES
    assert (
        MAX_INACTIVE_DEVICES <= counts[False] <= MAX_INACTIVE_DEVICES + 1
    )  # the last retired stays a call longer
    active = [d["token"] for d in (await client.get("/v1/users/u-churn")).json()["devices"] if d["active"]]
    assert active == tokens[-MAX_ACTIVE_DEVICES:]


@pytest.mark.parametrize("platform", ["fcm", "apns"])
async def test_a_token_past_the_index_row_limit_is_a_422_not_a_500(
    client: httpx.AsyncClient, platform: str
) -> None:
    # 2,720 characters was a 500 (the unique index on (user, token) holds at most 2,704 bytes a row),
    # and inline it failed the accept transaction other tenants' sends shared.
    longest = "a" * MAX_TOKEN_CHARS
    assert (await client.put("/v1/users/u-tokens", json={})).status_code in (200, 201)
    if platform == "fcm":
        ok = await client.post("/v1/users/u-tokens/devices", json={"platform": "fcm", "token": longest})
        assert ok.status_code == 201, ok.text
    for token in ("a" * (MAX_TOKEN_CHARS + 1), "a" * 2_720, "f" * 4_096):
        answer = await client.post("/v1/users/u-tokens/devices", json={"platform": platform, "token": token})
        assert answer.status_code == 422, answer.text
        send = {
            "event_id": f"evt-long-{platform}-{len(token)}", "channel": "push", "content": {"title": "t", "body": "b"},
            "user": {"id": "u-tokens", "devices": [{"platform": platform, "token": token}]},
        }  # fmt: skip
        inline = await client.post("/v1/notifications", json=send)
        assert inline.status_code == 422 and inline.json()["error"]["code"] == "validation_error", inline.text
