"""GET /v1/notifications: filtered, cursor-paginated search over the caller's own notifications."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from harness.services import ApiServer, api_client
from tests.conftest import make_tenant
from tests.fixtures.answers import assert_error
from tests.fixtures.sends import email_send


async def _send(client: httpx.AsyncClient, **overrides: Any) -> str:
    response = await client.post("/v1/notifications", json=email_send(**overrides))
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def _all_pages(client: httpx.AsyncClient, **params: Any) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = None
    while True:
        response = await client.get(
            "/v1/notifications", params={**params, **({"cursor": cursor} if cursor else {})}
        )
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append([item["id"] for item in body["items"]])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages


async def test_pages_walk_every_notification_newest_first_without_repeats(client: httpx.AsyncClient) -> None:
    sent = [await _send(client) for _ in range(5)]
    pages = await _all_pages(client, limit=2)
    assert [len(p) for p in pages] == [2, 2, 1]
    assert [nid for page in pages for nid in page] == list(reversed(sent))


async def test_filters_by_user_channel_status_and_time(client: httpx.AsyncClient) -> None:
    first = await _send(client, user={"id": "u-a", "email": "a@example.com", "phone": "+14155550101"})
    sms = await _send(
        client,
        user={"id": "u-a", "email": "a@example.com", "phone": "+14155550101"},
        channel="sms",
        template="otp",
        data={"code": "1"},
    )
    later = datetime.now(UTC) + timedelta(days=1)
    scheduled = await _send(client, user={"id": "u-b", "email": "b@example.com"}, send_at=later.isoformat())

    async def ids(**params: Any) -> list[str]:
        response = await client.get("/v1/notifications", params=params)
        assert response.status_code == 200, response.text
        return [item["id"] for item in response.json()["items"]]

    assert await ids(user="u-a") == [sms, first]
    assert await ids(user="u-a", channel="sms") == [sms]
    assert await ids(status="scheduled") == [scheduled]
    assert await ids(user="u-nobody") == []
    items = (await client.get("/v1/notifications", params={"user": "u-a"})).json()["items"]
    sms_created = items[0]["created_at"]
    assert await ids(since=sms_created) == [scheduled, sms]
    assert await ids(until=sms_created) == [first]
    assert items[0]["user_id"] == "u-a" and items[0]["channel"] == "sms"


async def test_another_tenants_notifications_never_appear(
    api: ApiServer, client: httpx.AsyncClient, engine: Any
) -> None:
    other = await make_tenant(engine)
    async with api_client(api.url, other.key) as theirs:
        theirs_id = await _send(theirs)
    mine = await _send(client)
    found = [nid for page in await _all_pages(client, limit=200) for nid in page]
    assert found == [mine]
    assert theirs_id not in [nid for page in await _all_pages(client, user="u-1") for nid in page]


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"status": "lost"}, "validation_error"),
        ({"channel": "fax"}, "validation_error"),
        ({"limit": 0}, "validation_error"),
        ({"limit": 201}, "validation_error"),
        ({"since": "yesterday"}, "validation_error"),
        ({"since": "2030-01-02T00:00:00Z", "until": "2030-01-01T00:00:00Z"}, "validation_error"),
        ({"cursor": "not-a-cursor"}, "validation_error"),
        ({"cursor": "1." + "0" * 31}, "validation_error"),
        ({"cursor": "1" * 18 + "." + "0" * 32}, "validation_error"),
    ],
)
async def test_invalid_filters_are_refused_with_422(
    client: httpx.AsyncClient, params: dict[str, Any], code: str
) -> None:
    assert_error(await client.get("/v1/notifications", params=params), 422, code)


async def test_search_needs_the_read_scope(api: ApiServer, engine: Any) -> None:
    sender = await make_tenant(engine, scopes=("send",))
    async with api_client(api.url, sender.key) as client:
        assert_error(await client.get("/v1/notifications"), 403, "forbidden")
    async with api_client(api.url, None) as anonymous:
        assert_error(await anonymous.get("/v1/notifications"), 401, "unauthorized")
