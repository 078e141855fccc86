"""POST /v1/notifications/batch and POST /v1/notifications/{id}/cancel."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from harness.services import ApiServer
from tests.conftest import Stack, TenantInfo, make_tenant
from tests.fixtures.answers import assert_error
from tests.fixtures.delivery import sandbox_for, status_of, wait_status
from tests.fixtures.render_turn import turn_held
from tests.fixtures.sends import email_send


async def test_batch_accepts_each_item_on_its_own(stack: Stack, client: httpx.AsyncClient) -> None:
    good = email_send()
    items = [
        good,
        email_send(channel="sms", template="otp", data={"code": "1"}, user={"id": "u-b", "phone": "12345"}),
        email_send(template="no_such_template"),
        good,  # the same event again: a duplicate of item 0
    ]
    response = await client.post("/v1/notifications/batch", json={"notifications": items})
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["accepted"], body["duplicates"], body["rejected"]) == (1, 1, 2)
    results = body["results"]
    assert [r["index"] for r in results] == [0, 1, 2, 3]
    assert results[1]["error"]["code"] == "validation_error"
    assert results[1]["error"]["details"][0]["field"] == "user.phone"
    assert results[2]["error"]["code"] == "unknown_template"
    assert results[3]["duplicate"] is True and results[3]["id"] == results[0]["id"]
    await wait_status(client, results[0]["id"], "sent")
    assert len(await sandbox_for(client, results[0]["id"])) == 1


async def test_a_batch_whose_tenants_render_turn_does_not_come_is_refused_for_a_retry(
    api: ApiServer, client: httpx.AsyncClient, tenant: TenantInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renderer's turn now says ``TurnNotReady`` when it does not come in time, which is no
    ``RenderError``: the batch still answers the 422 a client may retry, not a 500."""
    monkeypatch.setattr("core.render_turns.TURN_WAIT_S", 0.2)
    async with turn_held(api.app.state.renderer, tenant.id):
        response = await client.post("/v1/notifications/batch", json={"notifications": [email_send()]})
    error = assert_error(response, 422, "template_render_limit")
    assert "still rendering" in error["message"]


async def test_batch_over_1000_items_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/notifications/batch", json={"notifications": [email_send()] * 1001})
    error = assert_error(response, 422, "validation_error")
    assert error["details"][0]["field"] == "notifications"


async def test_cancelled_scheduled_notification_is_never_sent(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    send_at = (datetime.now(UTC) + timedelta(seconds=1.5)).isoformat()
    accepted = (await client.post("/v1/notifications", json=email_send(send_at=send_at))).json()
    assert accepted["status"] == "scheduled"
    witness = (await client.post("/v1/notifications", json=email_send(send_at=send_at))).json()
    response = await client.post(f"/v1/notifications/{accepted['id']}/cancel")
    assert response.status_code == 200, response.text
    assert response.json() == {"id": accepted["id"], "status": "cancelled"}
    # The relay picks due rows oldest first: once the witness, due at the same time, is sent, the
    # cancelled one has had its chance to go too.
    await wait_status(client, witness["id"], "sent")
    body = await status_of(client, accepted["id"])
    assert body["status"] == "cancelled"
    assert [h["status"] for h in body["history"]] == ["scheduled", "cancelled"]
    assert await sandbox_for(client, accepted["id"]) == []


async def test_a_sent_notification_cannot_be_cancelled(stack: Stack, client: httpx.AsyncClient) -> None:
    nid = (await client.post("/v1/notifications", json=email_send())).json()["id"]
    await wait_status(client, nid, "sent")
    error = assert_error(await client.post(f"/v1/notifications/{nid}/cancel"), 409, "not_cancellable")
    assert error["details"] == {"status": "sent"}


async def test_another_tenant_cannot_cancel(
    client: httpx.AsyncClient, api: ApiServer, engine: AsyncEngine
) -> None:
    send_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    nid = (await client.post("/v1/notifications", json=email_send(send_at=send_at))).json()["id"]
    other = await make_tenant(engine)
    async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {other.key}"}) as c:
        assert_error(await c.post(f"/v1/notifications/{nid}/cancel"), 404, "not_found")
    assert (await status_of(client, nid))["status"] == "scheduled"
