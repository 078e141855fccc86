"""GET /v1/analytics: rollups kept as notifications are accepted, sent and opened, read back with
their rates; and every bad parameter a 422 with the error body."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from harness.services import ApiServer, api_client, wait_until
from tests.conftest import Stack, make_tenant
from tests.fixtures.answers import assert_error
from tests.fixtures.delivery import wait_status
from tests.fixtures.sends import email_send


def rows_by(page: dict[str, Any], *dims: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    return {tuple(r["group"][d] for d in dims): r for r in page["rows"]}


async def test_sends_and_their_opens_are_counted_once_with_their_rates(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    ids = [(await client.post("/v1/notifications", json=email_send())).json()["id"] for _ in range(3)]
    inline = email_send(template=None, content={"subject": "s", "body": "b"})
    ids.append((await client.post("/v1/notifications", json=inline)).json()["id"])
    repeat = await client.post("/v1/notifications", json=email_send(event_id="same"))
    assert (await client.post("/v1/notifications", json=email_send(event_id="same"))).json()["duplicate"]
    ids.append(repeat.json()["id"])
    for nid in ids:
        await wait_status(client, nid, "sent")
    for _ in range(2):  # the same open twice, and a second person's open of another: 2 notifications opened
        await client.post(f"/v1/notifications/{ids[0]}/events", json={"type": "opened"})
    await client.post(f"/v1/notifications/{ids[1]}/events", json={"type": "opened", "occurred_at": None})
    for link in ("https://a.example/", "https://b.example/"):  # two links, one notification clicked
        await client.post(f"/v1/notifications/{ids[0]}/events", json={"type": "clicked", "link": link})

    async def page() -> dict[str, Any] | None:
        answer = await client.get(
            "/v1/analytics", params={"interval": "hour", "group_by": "channel,template"}
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        shipped = rows_by(body, "channel", "template").get(("email", "order_shipped"))
        # The accepted counts are written once a second (api.accepted_counts): the last send's too.
        done = shipped and shipped["counts"]["sent"] == 4 and shipped["counts"]["accepted"] == 4
        return body if done else None

    body = await wait_until(page)
    shipped = rows_by(body, "channel", "template")[("email", "order_shipped")]
    assert {k: shipped["counts"][k] for k in ("accepted", "sent", "failed", "opened", "clicked")} == {
        "accepted": 4, "sent": 4, "failed": 0, "opened": 2, "clicked": 1,
    }  # fmt: skip
    assert shipped["rates"]["open_rate"] == 0.5 and shipped["rates"]["sent_rate"] == 1.0
    assert shipped["rates"]["delivery_rate"] == 0.0 and shipped["rates"]["bounce_rate"] == 0.0
    inline_row = rows_by(body, "channel", "template")[("email", "")]
    assert inline_row["counts"]["accepted"] == 1 and inline_row["counts"]["sent"] == 1

    by_day = (await client.get("/v1/analytics", params={"interval": "day"})).json()
    assert sum(r["counts"]["accepted"] for r in by_day["rows"]) == 5 and by_day["group_by"] == []
    by_provider = rows_by(
        (await client.get("/v1/analytics", params={"group_by": "provider"})).json(), "provider"
    )
    assert by_provider[("sandbox",)]["counts"]["sent"] == 5 and by_provider[("",)]["counts"]["accepted"] == 5
    assert by_provider[("sandbox",)]["rates"]["sent_rate"] is None  # no accepted under a provider


async def test_another_tenant_sees_none_of_it(
    api: ApiServer, engine: AsyncEngine, stack: Stack, client: httpx.AsyncClient
) -> None:
    await client.post("/v1/notifications", json=email_send())
    other = await make_tenant(engine)
    async with api_client(api.url, other.key) as c:
        assert (await c.get("/v1/analytics")).json()["rows"] == []


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"group_by": "tenant_id"}, "invalid_group_by"),
        ({"group_by": "channel,channel"}, "invalid_group_by"),
        ({"group_by": "channel;drop"}, "validation_error"),
        ({"group_by": "x" * 101}, "validation_error"),
        ({"since": "2026-01-01T00:00:00"}, "validation_error"),  # no zone
        ({"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "invalid_range"),
        (
            {"since": "2025-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z", "interval": "hour"},
            "invalid_range",
        ),
        ({"since": "1900-01-01T00:00:00Z", "until": "2026-01-01T00:00:00Z"}, "invalid_range"),
        ({"interval": "minute"}, "validation_error"),
        ({"template": "a\x00b"}, "validation_error"),
        ({"channel": "fax"}, "validation_error"),
    ],
)
async def test_bad_parameters_are_a_422_with_the_error_body(
    client: httpx.AsyncClient, params: dict[str, str], code: str
) -> None:
    assert_error(await client.get("/v1/analytics", params=params), 422, code)


async def test_analytics_needs_the_read_scope(api: ApiServer, engine: AsyncEngine) -> None:
    sender = await make_tenant(engine, scopes=("send",))
    async with api_client(api.url, sender.key) as c:
        assert_error(await c.get("/v1/analytics"), 403, "forbidden")
