"""Template bombs sent as inline content: a 422 naming the limit, nothing stored, and the API keeps
answering other requests while the bombs are refused (renders run off the event loop)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import TenantInfo
from tests.fixtures.answers import refused
from tests.fixtures.hostile_templates import HOSTILE
from tests.fixtures.sends import count_notifications, email_send

SAMPLE = [
    "power_squaring", "sum_lists", "repr_string", "repr_output", "parens_100", "nested_if_100",
    "plus_chain", "nested_range_loop", "macro_recursion", "sort_big",
]  # fmt: skip


def _bomb(body: str, n: int) -> dict[str, Any]:
    send = email_send(event_id=f"bomb-{n}")
    send.pop("template", None)
    send.pop("data", None)
    send["content"] = {"subject": "s", "body": body}
    return send


@pytest.mark.parametrize("name", SAMPLE)
async def test_template_bomb_is_a_422_naming_the_limit(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, name: str
) -> None:
    error = refused(await client.post("/v1/notifications", json=_bomb(HOSTILE[name], 1)), 422)
    assert error["code"] in {"template_render_limit", "template_syntax_error"}, error
    assert await count_notifications(engine, tenant.id) == 0


async def test_the_api_answers_health_checks_while_bombs_render(client: httpx.AsyncClient) -> None:
    bombs = [
        asyncio.ensure_future(client.post("/v1/notifications", json=_bomb(HOSTILE["nested_range_loop"], n)))
        for n in range(6)
    ]
    answered_while_rendering = 0
    while not all(b.done() for b in bombs):
        if (await client.get("/healthz")).status_code == 200 and not all(b.done() for b in bombs):
            answered_while_rendering += 1
    for bomb in bombs:
        refused(await bomb, 422)
    assert answered_while_rendering >= 3, "health checks waited for the renders"


async def test_a_batch_of_slow_templates_shares_one_render_budget(client: httpx.AsyncClient) -> None:
    items = [_bomb(HOSTILE["nested_range_loop"], n) for n in range(20)]
    response = await client.post("/v1/notifications/batch", json={"notifications": items})
    assert response.status_code == 202, response.text
    results = response.json()["results"]
    assert all(r["error"]["code"] == "template_render_limit" for r in results), results
    spent = [r for r in results if "budget" in r["error"]["message"]]
    assert len(spent) >= 10, "each item got a budget of its own"
