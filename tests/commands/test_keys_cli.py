"""``clarion keys create`` as a real OS process: the tenant id it creates is a printable id
(``clarion/printable_ids.py``); a tenant stored before the rule still gets keys."""

from __future__ import annotations

import secrets

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.settings import Settings
from harness.tenants import make_tenant
from tests.clarion.test_newcomer_papercuts import _clarion
from tests.fixtures.db import scalar


def env(settings: Settings) -> dict[str, str]:
    return {"CLARION_DATABASE_URL": settings.database_url, "CLARION_SECRET_KEY": secrets.token_hex(32)}


async def tenants_named(engine: AsyncEngine, tenant_id: str) -> int:
    return int(await scalar(engine, "SELECT count(*) FROM tenants WHERE id = :t", t=tenant_id))


@pytest.mark.parametrize("hostile", ["acme\x1b]52;c;eA==\x07", "acme\u202e", "acme "], ids=ascii)
async def test_keys_create_refuses_a_new_tenant_id_that_is_not_printable(
    settings: Settings, engine: AsyncEngine, hostile: str
) -> None:
    tenant = (
        f"{hostile}{secrets.token_hex(2)}"
        if not hostile.endswith(" ")
        else f"{secrets.token_hex(2)}{hostile}"
    )
    code, out, err = await _clarion("keys", "create", "--tenant", tenant, env=env(settings))
    assert code != 0 and out == ""
    assert "--tenant" in err and "printable" in err and "\x1b" not in err and "\u202e" not in err
    assert await tenants_named(engine, tenant) == 0  # rolled back, keys and templates too


async def test_keys_create_still_gives_a_tenant_stored_before_the_rule_a_key(
    settings: Settings, engine: AsyncEngine
) -> None:
    tenant = f"old\u202etenant-{secrets.token_hex(2)}"
    await make_tenant(engine, tenant_id=tenant)  # as stored before 2026-11-29
    code, out, err = await _clarion("keys", "create", "--tenant", tenant, env=env(settings))
    assert code == 0, err
    assert out.strip().startswith("clk_")
