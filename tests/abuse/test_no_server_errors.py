"""Inputs that answered 500 (or half-committed a batch): each is now a 4xx with the error body."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import TenantInfo
from tests.fixtures.answers import refused
from tests.fixtures.sends import count_notifications, email_send


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("query", ["error_code=" + "e" * 65, "provider=" + "p" * 33])
async def test_overlong_dlq_filters_are_a_422(client: httpx.AsyncClient, query: str) -> None:
    refused(await client.get(f"/v1/ops/dlq/email?{query}"), 422)


@pytest.mark.parametrize("field", ["send_at", "expires_at"])
async def test_a_time_without_a_zone_is_a_422(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, field: str
) -> None:
    refused(await client.post("/v1/notifications", json=email_send(**{field: "2030-01-01T00:00:00"})), 422)
    assert await count_notifications(engine, tenant.id) == 0


async def test_a_batch_with_a_naive_time_refuses_that_item_and_names_the_valid_ones_id(
    client: httpx.AsyncClient,
) -> None:
    items = [email_send(), email_send(send_at="2030-01-01T00:00:00")]
    response = await client.post("/v1/notifications/batch", json={"notifications": items})
    assert response.status_code == 202, response.text
    valid, naive = response.json()["results"]
    assert valid["id"] and valid["error"] is None
    assert naive["id"] is None and naive["error"]["code"] == "validation_error"


async def test_a_redrive_window_without_a_zone_is_a_422(client: httpx.AsyncClient) -> None:
    body = {"since": "2020-01-01T00:00:00", "until": "2030-01-01T00:00:00Z"}
    refused(await client.post("/v1/ops/dlq/email/redrive", json=body), 422)


@pytest.mark.parametrize("depth", [50, 300, 900])
async def test_deeply_nested_data_is_a_4xx_alone_and_in_a_batch(
    client: httpx.AsyncClient, depth: int
) -> None:
    send = email_send(data={"order_id": "1", "deep": _nested(depth)})
    refused(await client.post("/v1/notifications", json=send))  # 400 past the parser's depth, else 422
    items = [email_send(), email_send(data={"order_id": "1", "deep": _nested(depth)})]
    response = await client.post("/v1/notifications/batch", json={"notifications": items})
    if response.status_code == 202:  # refused item by item
        assert [r["error"] is None for r in response.json()["results"]] == [True, False]
    else:  # or the whole body, past the JSON parser's depth limit: nothing half done
        refused(response)
        assert response.json()["error"]["code"] == "malformed_json"


async def test_a_batch_item_holding_more_values_than_a_send_can_is_refused_alone(
    client: httpx.AsyncClient,
) -> None:
    items = [email_send(), email_send(data={"order_id": "1", "n": [0] * 100_000})]
    response = await client.post("/v1/notifications/batch", json={"notifications": items})
    assert response.status_code == 202, response.text
    results = response.json()["results"]
    assert results[0]["error"] is None and "more than 32,768 values" in results[1]["error"]["message"]


async def test_a_refused_body_nested_100000_deep_is_counted_without_a_500(client: httpx.AsyncClient) -> None:
    body = "[" * 100_000 + "]" * 100_000
    response = await client.post(
        "/v1/notifications", content=body, headers={"Content-Type": "application/json"}
    )
    refused(response)


@pytest.mark.parametrize(
    "where",
    [
        {"data": {"order_id": "\ud800"}},
        {"data": {"order_id": "1", "\udfff": "x"}},
        {"event_id": "evt-\ud800"},
        {"user": {"id": "u-\ud800", "email": "ada@example.com"}},
    ],
)
async def test_lone_surrogates_in_a_send_are_a_422(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, where: dict[str, Any]
) -> None:
    body = json.dumps(email_send(**where))  # ensure_ascii: the surrogate travels as \ud800, as JSON allows
    response = await client.post(
        "/v1/notifications", content=body, headers={"Content-Type": "application/json"}
    )
    refused(response, 422)
    assert await count_notifications(engine, tenant.id) == 0


async def test_inline_content_holding_a_lone_surrogate_is_a_422(client: httpx.AsyncClient) -> None:
    send = email_send(content={"subject": "s", "body": "Code: \ud800"})
    send.pop("template")
    body = json.dumps(send)
    response = await client.post(
        "/v1/notifications", content=body, headers={"Content-Type": "application/json"}
    )
    refused(response, 422)


@pytest.mark.parametrize(
    "key", ["from", "message_type", "google.c.a.e", "gcm.notification.title", "googleId", "gcmToken"]
)
async def test_a_push_with_a_data_key_fcm_reserves_is_a_422_naming_it(
    client: httpx.AsyncClient, key: str
) -> None:
    send = {
        "event_id": f"push-{key}",
        "user": {"id": "u-push", "devices": [{"platform": "fcm", "token": "fcm-token-" + "x" * 40}]},
        "channel": "push",
        "content": {"title": "t", "body": "b"},
        "data": {key: "x"},
    }
    error = refused(await client.post("/v1/notifications", json=send), 422)
    assert key in error["message"] or key in json.dumps(error.get("details"))


@pytest.mark.parametrize(
    "user",
    [
        {"id": "u-tz", "email": "ada@example.com", "timezone": "Mars/Olympus_Mons"},
        {"id": "u-tz", "email": "ada@example.com", "timezone": "../../etc/passwd"},
        {
            "id": "u-apns",
            "email": "ada@example.com",
            "devices": [{"platform": "apns", "token": "not-hex-" * 9}],
        },
        {"id": "u-fcm", "email": "ada@example.com", "devices": [{"platform": "fcm", "token": "short-token"}]},
    ],
)
async def test_inline_user_details_get_the_validation_of_v1_users(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, user: dict[str, Any]
) -> None:
    refused(await client.post("/v1/notifications", json=email_send(user=user)), 422)
    assert await count_notifications(engine, tenant.id) == 0
