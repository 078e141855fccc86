"""Rate-limit rule names hold a safe charset: a name is quoted in 429s, in the history of held and
dropped notifications, on ``/ops`` and on the operator's terminal, and until 2026-11-28 the API took
any 128 characters there (an OSC 52 clipboard write, a bidi override, a newline, a C1 control)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from harness.services import ApiServer
from schema.models import RateLimitRule
from tests.conftest import TenantInfo
from tests.fixtures.answers import assert_error
from tests.fixtures.rules import wait_loaded
from tests.fixtures.sends import email_send


def cap(**overrides: Any) -> dict[str, Any]:
    return {
        "name": "push-cap",
        "scope": "recipient",
        "channel": "push",
        "limit": 3,
        "period_s": 3600,
    } | overrides


HOSTILE_NAMES = [
    "\x1b]52;c;aGk=\x07",  # OSC 52: writes the reader's clipboard
    "cap\u202egnp.exe",  # a bidi override: reads as "capexe.png"
    "cap\nheld by tenant rule 'x'",  # a forged second line in a history or a log
    "cap\x9b2J",  # C1 CSI: clears the screen of terminals that honour it
    "cap\u200b",  # zero width: two names that read the same
    "cap\r",
    "cap\n",  # a trailing newline passes Python's `$`
    "tenant:t-1",  # the separator of limiter keys
    "two words",
    "-leading-dash",
    ".hidden",
    "cäp",
    "x" * 65,
]


@pytest.mark.parametrize("name", HOSTILE_NAMES, ids=ascii)
async def test_a_rule_name_outside_the_safe_charset_is_a_422_and_nothing_is_stored(
    client: httpx.AsyncClient, name: str
) -> None:
    response = await client.post("/v1/rate-limits", json=cap(name=name))
    error = assert_error(response, 422, "validation_error")
    assert error["details"][0]["field"] == "name"
    assert (await client.get("/v1/rate-limits")).json() == []


async def test_a_rule_cannot_be_renamed_outside_the_safe_charset(client: httpx.AsyncClient) -> None:
    rule = (await client.post("/v1/rate-limits", json=cap())).json()
    for name in HOSTILE_NAMES:
        response = await client.put(f"/v1/rate-limits/{rule['id']}", json=cap(name=name, limit=9))
        assert_error(response, 422, "validation_error")
    assert (await client.get(f"/v1/rate-limits/{rule['id']}")).json() == rule


async def test_names_up_to_64_safe_characters_are_taken_and_empty_still_means_unnamed(
    client: httpx.AsyncClient,
) -> None:
    for name in ["", "a", "9", "push-cap", "A.b_c-9", "x" * 64]:
        created = await client.post("/v1/rate-limits", json=cap(name=name))
        assert created.status_code == 201, created.text
        assert created.json()["name"] == name
    response = await client.post("/v1/rate-limits", json=cap(name="x" * 65))
    assert_error(response, 422, "validation_error")


async def test_a_rule_stored_under_an_unsafe_name_still_refuses_and_is_called_by_its_id(
    client: httpx.AsyncClient, api: ApiServer, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    name = "\x1b]52;c;aGk=\x07cap\u202egnp.exe\n"  # stored before names were checked
    async with engine.begin() as conn:
        rule_id = (
            await conn.execute(
                sa.insert(RateLimitRule.__table__)  # type: ignore[attr-defined]
                .values(tenant_id=tenant.id, name=name, scope="tenant", limit=1, period_s=600.0)
                .returning(sa.column("id"))
            )
        ).scalar_one()
    rule = {"id": str(rule_id)}
    await wait_loaded(api, rule)
    await client.post("/v1/notifications", json=email_send())
    error = assert_error(await client.post("/v1/notifications", json=email_send()), 429, "rate_limited")
    assert error["details"]["rule"] == rule["id"] and f"'{rule['id']}'" in error["message"]
    assert name not in json.dumps(error, ensure_ascii=False)

    assert (await client.get(f"/v1/rate-limits/{rule_id}")).json()["name"] == name  # as stored
    stored = {"scope": "tenant", "limit": 1, "period_s": 600.0}
    assert_error(
        await client.put(f"/v1/rate-limits/{rule_id}", json={**stored, "name": name}), 422, "validation_error"
    )
    renamed = await client.put(f"/v1/rate-limits/{rule_id}", json={**stored, "name": "ten-minutes"})
    assert renamed.status_code == 200 and renamed.json()["name"] == "ten-minutes"
