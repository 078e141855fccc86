"""A tenant's rules and templates are capped (every process loads every tenant's rules), and the
rate-limit metrics are labelled by scope, so one tenant cannot slow or flood everyone else."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.rules import RuleSpec
from clarion.settings import Settings
from harness.services import ApiServer, api_client
from tests.conftest import make_tenant
from tests.fixtures.answers import refused

CAP = 3


@pytest.fixture
async def capped_api(settings: Settings) -> AsyncIterator[ApiServer]:
    server = ApiServer(
        settings.model_copy(update={"max_rules_per_tenant": CAP, "max_templates_per_tenant": CAP})
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
