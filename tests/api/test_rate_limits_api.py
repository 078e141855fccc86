"""/v1/rate-limits CRUD and /v1/tenant/settings: validated, per tenant, admin only."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from harness.services import ApiServer, api_client
from tests.conftest import make_tenant
from tests.fixtures.answers import assert_error


def cap(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "push-cap",
        "scope": "recipient",
        "channel": "push",
        "limit": 3,
        "period_s": 3600,
        "action": "drop",
    }
    body.update(overrides)
    return body


async def test_created_rule_is_listed_read_replaced_and_deleted(client: httpx.AsyncClient) -> None:
    created = await client.post("/v1/rate-limits", json=cap())
    assert created.status_code == 201, created.text
    rule = created.json()
    assert rule["scope"] == "recipient" and rule["limit"] == 3 and rule["action"] == "drop"
    assert rule["enabled"] is True and rule["mode"] == "hard"
    assert [r["id"] for r in (await client.get("/v1/rate-limits")).json()] == [rule["id"]]
    assert (await client.get(f"/v1/rate-limits/{rule['id']}")).json() == rule

    replaced = await client.put(f"/v1/rate-limits/{rule['id']}", json=cap(limit=5, action="delay"))
    assert replaced.status_code == 200, replaced.text
    assert (replaced.json()["limit"], replaced.json()["action"]) == (5, "delay")
    assert replaced.json()["updated_at"] > rule["updated_at"]

    assert (await client.delete(f"/v1/rate-limits/{rule['id']}")).status_code == 204
    assert_error(await client.get(f"/v1/rate-limits/{rule['id']}"), 404, "not_found")
    assert (await client.get("/v1/rate-limits")).json() == []


async def test_ingress_rules_default_to_reject_and_worker_rules_to_delay(client: httpx.AsyncClient) -> None:
    tenant = await client.post("/v1/rate-limits", json={"scope": "tenant", "limit": 100, "period_s": 1})
    recipient = await client.post("/v1/rate-limits", json=cap(action=None))
    assert tenant.json()["action"] == "reject"
    assert recipient.json()["action"] == "delay"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"limit": 0}, "limit"),
        ({"period_s": 0}, "period_s"),
        ({"burst": -1}, "burst"),
        ({"scope": "everyone"}, "scope"),
        ({"mode": "turbo"}, "mode"),
        ({"action": "reject"}, "body"),  # a worker rule cannot reject: the send was already accepted
        ({"scope": "tenant", "action": "delay", "channel": None}, "body"),
        ({"scope": "tenant", "channel": "push", "action": "reject"}, "body"),
        ({"burst": 2}, "body"),  # a frequency cap has no burst
        ({"scope": "provider", "provider": "pigeon"}, "body"),
        ({"mode": "soft"}, "body"),  # soft without an overshoot is hard
        ({"mode": "elastic", "scope": "tenant", "channel": None, "action": "reject"}, "body"),
        ({"mode": "elastic", "scope": "api_key", "channel": None, "action": "reject"}, "body"),
        ({"mode": "elastic", "scope": "provider", "provider": "apns"}, "body"),  # it is the pool
        ({"mode": "elastic", "channel": None}, "body"),  # which channel's pacing to borrow from?
        ({"mode": "elastic", "overshoot_pct": 50}, "body"),
        ({"colour": "red"}, "colour"),
        ({"period_s": 5e-324}, "period_s"),  # 10^7 per ~0 s: the limiter divided by zero
        ({"period_s": 1e-4}, "period_s"),
        ({"limit": 10_000_000, "period_s": 1}, "body"),  # ten events per microsecond
        ({"limit": 2**70}, "limit"),
        ({"burst": 2**70}, "burst"),
    ],
)
async def test_invalid_rules_are_refused_naming_the_problem(
    client: httpx.AsyncClient, overrides: dict[str, Any], field: str
) -> None:
    error = assert_error(await client.post("/v1/rate-limits", json=cap(**overrides)), 422, "validation_error")
    assert error["details"][0]["field"] == field
    assert (await client.get("/v1/rate-limits")).json() == []


async def test_another_tenants_rules_are_invisible_and_untouchable(
    client: httpx.AsyncClient, api: ApiServer, engine: AsyncEngine
) -> None:
    rule = (await client.post("/v1/rate-limits", json=cap())).json()
    other = await make_tenant(engine)
    async with api_client(api.url, other.key) as theirs:
        assert (await theirs.get("/v1/rate-limits")).json() == []
        assert_error(await theirs.get(f"/v1/rate-limits/{rule['id']}"), 404, "not_found")
        assert_error(await theirs.put(f"/v1/rate-limits/{rule['id']}", json=cap()), 404, "not_found")
        assert_error(await theirs.delete(f"/v1/rate-limits/{rule['id']}"), 404, "not_found")
    assert (await client.get(f"/v1/rate-limits/{rule['id']}")).json()["limit"] == 3


async def test_rules_and_tenant_settings_need_the_admin_scope(api: ApiServer, engine: AsyncEngine) -> None:
    sender = await make_tenant(engine, scopes=("send", "read"))
    async with api_client(api.url, sender.key) as c:
        assert_error(await c.post("/v1/rate-limits", json=cap()), 403, "forbidden")
        assert_error(await c.get("/v1/rate-limits"), 403, "forbidden")
        assert_error(
            await c.put("/v1/tenant/settings", json={"content_dedupe_window_s": 60}), 403, "forbidden"
        )


async def test_content_dedupe_window_is_set_read_and_turned_off(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/tenant/settings")).json() == {
        "content_dedupe_window_s": None,
        "email_tracking": False,
    }
    updated = await client.put("/v1/tenant/settings", json={"content_dedupe_window_s": 300})
    assert updated.status_code == 200 and updated.json() == {
        "content_dedupe_window_s": 300,
        "email_tracking": False,
    }
    assert (await client.get("/v1/tenant/settings")).json() == {
        "content_dedupe_window_s": 300,
        "email_tracking": False,
    }
    assert_error(
        await client.put("/v1/tenant/settings", json={"content_dedupe_window_s": 0}), 422, "validation_error"
    )
    off = await client.put("/v1/tenant/settings", json={"content_dedupe_window_s": None})
    assert off.json() == {"content_dedupe_window_s": None, "email_tracking": False}


def pacing(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "apns-pacing",
        "scope": "provider",
        "channel": "push",
        "provider": "apns",
        "limit": 100,
        "period_s": 1,
    }
    body.update(overrides)
    return body


async def test_an_elastic_cap_is_accepted_once_its_channel_is_paced(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/rate-limits", json=pacing())).status_code == 201

    created = await client.post("/v1/rate-limits", json=cap(mode="elastic"))

    assert created.status_code == 201, created.text
    rule = created.json()
    assert (rule["mode"], rule["channel"], rule["overshoot_pct"]) == ("elastic", "push", 0.0)
    hard = await client.put(f"/v1/rate-limits/{rule['id']}", json=cap())
    assert hard.status_code == 200 and hard.json()["mode"] == "hard"
    elastic = await client.put(f"/v1/rate-limits/{rule['id']}", json=cap(mode="elastic", limit=5))
    assert elastic.status_code == 200 and (elastic.json()["mode"], elastic.json()["limit"]) == ("elastic", 5)


async def test_an_elastic_cap_with_no_pacing_for_its_channel_is_refused(client: httpx.AsyncClient) -> None:
    # pacing for SMS only: nothing measures what the push provider can spare
    await client.post("/v1/rate-limits", json=pacing(channel="sms", provider="twilio"))
    await client.post("/v1/rate-limits", json=pacing(channel=None, provider="twilio"))  # never sends push
    await client.post("/v1/rate-limits", json=pacing(enabled=False))

    error = assert_error(
        await client.post("/v1/rate-limits", json=cap(mode="elastic")), 422, "elastic_without_pacing"
    )

    assert error["details"] == {"field": "mode", "channel": "push"}
    assert "push" in error["message"] and "provider" in error["message"]
    hard = (await client.post("/v1/rate-limits", json=cap())).json()
    assert_error(
        await client.put(f"/v1/rate-limits/{hard['id']}", json=cap(mode="elastic")),
        422,
        "elastic_without_pacing",
    )
    assert (await client.get(f"/v1/rate-limits/{hard['id']}")).json()["mode"] == "hard"
    # a disabled elastic rule enforces nothing yet: it may wait for its pacing rule
    draft = await client.post("/v1/rate-limits", json=cap(mode="elastic", enabled=False))
    assert draft.status_code == 201, draft.text


async def test_a_pacing_rule_turned_into_the_elastic_cap_no_longer_counts_as_its_pool(
    client: httpx.AsyncClient,
) -> None:
    paced = (await client.post("/v1/rate-limits", json=pacing())).json()

    replaced = await client.put(f"/v1/rate-limits/{paced['id']}", json=cap(mode="elastic"))

    assert_error(replaced, 422, "elastic_without_pacing")
    assert (await client.get(f"/v1/rate-limits/{paced['id']}")).json()["scope"] == "provider"


@pytest.mark.parametrize("paced_by", [{"provider": None}, {"channel": None}, {"provider": "sandbox"}])
async def test_pacing_of_any_provider_serving_the_channel_is_a_pool(
    client: httpx.AsyncClient, paced_by: dict[str, Any]
) -> None:
    await client.post("/v1/rate-limits", json=pacing(**paced_by))

    created = await client.post("/v1/rate-limits", json=cap(mode="elastic"))

    assert created.status_code == 201, created.text


async def test_a_global_pacing_rule_is_a_pool_for_every_tenant(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    rule_id = uuid.uuid4()
    async with engine.begin() as conn:  # operators manage global rules in the database
        await conn.execute(
            sa.text(
                'INSERT INTO rate_limit_rules (id, name, scope, channel, provider, "limit", period_s, burst,'
                " mode, overshoot_pct, action, enabled)"
                " VALUES (:id, 'global-email-pacing', 'provider', 'email', NULL, 10000000, 1, 0, 'hard', 0,"
                " 'delay', true)"
            ),
            {"id": rule_id},
        )
    try:
        created = await client.post("/v1/rate-limits", json=cap(mode="elastic", channel="email"))
    finally:
        async with engine.begin() as conn:
            await conn.execute(sa.text("DELETE FROM rate_limit_rules WHERE id = :id"), {"id": rule_id})

    assert created.status_code == 201, created.text


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e999"])
async def test_non_finite_rule_numbers_are_refused(client: httpx.AsyncClient, literal: str) -> None:
    body = '{"scope": "provider", "provider": "sandbox", "limit": 10, "period_s": ' + literal + "}"
    response = await client.post(
        "/v1/rate-limits", content=body, headers={"Content-Type": "application/json"}
    )
    assert 400 <= response.status_code < 500 and "error" in response.json(), response.text
    assert (await client.get("/v1/rate-limits")).json() == []
