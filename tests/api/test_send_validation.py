"""Bad input is refused with a clear error and leaves nothing behind."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from core.horizon import MAX_WAIT
from harness.services import ApiServer
from tests.conftest import TenantInfo, make_tenant
from tests.fixtures.answers import assert_error
from tests.fixtures.sends import count_notifications, email_send


async def test_valid_send_is_accepted_with_202(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/notifications", json=email_send())
    assert response.status_code == 202, response.text
    assert response.json()["status"] == "accepted"
    assert response.json()["duplicate"] is False


@pytest.mark.parametrize(
    ("overrides", "status", "code", "field"),
    [
        ({"channel": "fax"}, 422, "validation_error", "channel"),
        (
            {"user": {"id": "u-1", "phone": "555-0100"}, "channel": "sms"},
            422,
            "validation_error",
            "user.phone",
        ),
        ({"user": {"id": "u-1", "email": "not-an-email"}}, 422, "validation_error", "user.email"),
        ({"event_id": ""}, 422, "validation_error", "event_id"),
        ({"priority": "urgent"}, 422, "validation_error", "priority"),
        ({"template": None}, 422, "validation_error", "body"),
        ({"user": None}, 422, "validation_error", "body"),
        ({"template": None, "content": {"body": "b"}}, 422, "validation_error", "body"),  # no subject
        ({"template": None, "content": {"subject": " ", "body": "b"}}, 422, "validation_error", "body"),
    ],
)
async def test_invalid_fields_are_refused_naming_the_field(
    client: httpx.AsyncClient,
    engine: AsyncEngine,
    tenant: TenantInfo,
    overrides: dict[str, Any],
    status: int,
    code: str,
    field: str,
) -> None:
    error = assert_error(await client.post("/v1/notifications", json=email_send(**overrides)), status, code)
    assert any(d["field"] == field for d in error["details"]), error
    assert await count_notifications(engine, tenant.id) == 0


async def test_missing_fields_are_listed(client: httpx.AsyncClient) -> None:
    error = assert_error(
        await client.post("/v1/notifications", json={"channel": "email"}), 422, "validation_error"
    )
    assert "event_id" in {d["field"] for d in error["details"]}


async def test_malformed_json_is_a_400(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/notifications", content=b'{"event_id": ', headers={"content-type": "application/json"}
    )
    assert_error(response, 400, "malformed_json")


async def test_body_over_the_limit_is_a_413(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    big = email_send(data={"order_id": "1", "blob": "x" * 70_000})
    assert_error(await client.post("/v1/notifications", json=big), 413, "payload_too_large")
    assert await count_notifications(engine, tenant.id) == 0


async def test_push_without_a_device_is_refused(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    body = email_send(channel="push", user={"id": "u-nodev", "email": "a@example.com"})
    assert_error(await client.post("/v1/notifications", json=body), 422, "no_device")
    assert await count_notifications(engine, tenant.id) == 0


async def test_sms_without_a_phone_is_refused(client: httpx.AsyncClient) -> None:
    body = email_send(
        channel="sms", template="otp", data={"code": "1"}, user={"id": "u-nophone", "email": "a@example.com"}
    )
    assert_error(await client.post("/v1/notifications", json=body), 422, "no_contact")


async def test_unknown_template_is_refused(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    assert_error(
        await client.post("/v1/notifications", json=email_send(template="nope")), 422, "unknown_template"
    )
    assert await count_notifications(engine, tenant.id) == 0


async def test_missing_template_variable_names_the_variable(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    error = assert_error(
        await client.post("/v1/notifications", json=email_send(data={})), 422, "missing_template_variable"
    )
    assert error["details"] == {"variable": "order_id"}
    assert await count_notifications(engine, tenant.id) == 0


async def test_unknown_user_id_is_refused(client: httpx.AsyncClient) -> None:
    body = email_send(user=None, user_id="nobody-here")
    assert_error(await client.post("/v1/notifications", json=body), 422, "unknown_user")


async def test_missing_or_wrong_key_is_401(api: ApiServer) -> None:
    async with httpx.AsyncClient(base_url=api.url) as anon:
        assert_error(await anon.post("/v1/notifications", json=email_send()), 401, "unauthorized")
        wrong = {"Authorization": "Bearer clk_nope_notarealsecret"}
        assert_error(
            await anon.post("/v1/notifications", json=email_send(), headers=wrong), 401, "unauthorized"
        )
        garbage = {"Authorization": "Basic abc"}
        assert_error(
            await anon.post("/v1/notifications", json=email_send(), headers=garbage), 401, "unauthorized"
        )


async def test_key_without_send_scope_is_403(api: ApiServer, engine: AsyncEngine) -> None:
    reader = await make_tenant(engine, scopes=("read",))
    async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {reader.key}"}) as c:
        assert_error(await c.post("/v1/notifications", json=email_send()), 403, "forbidden")
    assert await count_notifications(engine, reader.id) == 0


async def test_same_event_id_returns_the_first_notification(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    body = email_send()
    first = await client.post("/v1/notifications", json=body)
    again = await client.post("/v1/notifications", json=body)
    assert first.status_code == 202 and again.status_code == 200
    assert again.json() == {"id": first.json()["id"], "status": again.json()["status"], "duplicate": True}
    assert await count_notifications(engine, tenant.id) == 1


async def test_same_event_id_with_a_different_body_is_409(client: httpx.AsyncClient) -> None:
    body = email_send()
    assert (await client.post("/v1/notifications", json=body)).status_code == 202
    changed = {**body, "data": {"order_id": "999"}}
    error = assert_error(await client.post("/v1/notifications", json=changed), 409, "event_id_conflict")
    assert error["details"]["id"]


async def test_another_tenants_notification_is_not_found(
    client: httpx.AsyncClient, api: ApiServer, engine: AsyncEngine
) -> None:
    created = (await client.post("/v1/notifications", json=email_send())).json()["id"]
    other = await make_tenant(engine)
    async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {other.key}"}) as c:
        assert_error(await c.get(f"/v1/notifications/{created}"), 404, "not_found")


async def test_an_email_whose_subject_renders_blank_is_a_422_and_its_batch_neighbour_is_accepted(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    """Every email provider refuses a blank subject (``missing_subject``), which before this check
    came only after the 202: inline content and a template alike are rendered at accept."""
    inline = email_send(template=None, content={"subject": "{{ title }}", "body": "b"}, data={"title": ""})
    assert_error(await client.post("/v1/notifications", json=inline), 422, "template_empty_subject")

    template = {
        "name": "titled", "channel": "email", "subject": "{{ title }}", "body": "Hi",
        "sample_data": {"title": "Your order"},
    }  # fmt: skip
    assert (await client.post("/v1/templates", json=template)).status_code == 201
    blank = email_send(template="titled", data={"title": " \t"})
    items = [blank, email_send(template="titled", data={"title": "Your order"})]
    response = await client.post("/v1/notifications/batch", json={"notifications": items})
    assert response.status_code == 202, response.text
    results = response.json()["results"]
    assert results[0]["error"]["code"] == "template_empty_subject"
    assert results[1]["status"] == "accepted" and results[1].get("error") is None, results[1]
    assert await count_notifications(engine, tenant.id) == 1


async def test_a_send_scheduled_past_the_horizon_is_a_422_naming_send_at(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    """A scheduled send keeps its day of the log past retention until it is final: one a day
    scheduled for 9999 would keep every day of the log for ever."""
    now = datetime.now(UTC)
    for far in (now + MAX_WAIT + timedelta(minutes=1), datetime(9999, 12, 31, tzinfo=UTC)):
        error = assert_error(
            await client.post("/v1/notifications", json=email_send(send_at=far.isoformat())),
            422,
            "validation_error",
        )
        assert any(d["field"] == "send_at" for d in error["details"]), error
    assert await count_notifications(engine, tenant.id) == 0
    near = now + MAX_WAIT - timedelta(minutes=1)
    accepted = await client.post("/v1/notifications", json=email_send(send_at=near.isoformat()))
    assert accepted.status_code == 202 and accepted.json()["status"] == "scheduled", accepted.text
