"""End to end over the real broker and PostgreSQL: API -> log -> Kafka -> worker -> sandbox -> log."""

from __future__ import annotations

import secrets

import httpx

from tests.conftest import Stack
from tests.fixtures.delivery import sandbox_for, status_of, wait_status
from tests.fixtures.sends import email_send


async def test_email_send_is_sent_through_the_sandbox(stack: Stack, client: httpx.AsyncClient) -> None:
    accepted = await client.post("/v1/notifications", json=email_send())
    assert accepted.status_code == 202
    nid = accepted.json()["id"]
    body = await wait_status(client, nid, "sent")
    assert body["provider"] == "sandbox"
    assert body["provider_message_id"].startswith("sbx-")
    statuses = [h["status"] for h in body["history"]]
    assert statuses[0] == "accepted" and statuses[-1] == "sent" and "sending" in statuses
    assert [a["outcome"] for a in body["delivery_attempts"]] == ["sent"]
    [message] = await sandbox_for(client, nid)
    assert message["recipient"] == "ada@example.com"
    assert "123" in message["subject"] and "123" in message["body"]


async def test_sms_and_push_are_sent(stack: Stack, client: httpx.AsyncClient) -> None:
    token = secrets.token_hex(32)
    sms = email_send(channel="sms", template="otp", data={"code": "424242"})
    push = email_send(
        channel="push", user={"id": "u-push", "devices": [{"platform": "apns", "token": token}]}
    )
    ids = [(await client.post("/v1/notifications", json=b)).json()["id"] for b in (sms, push)]
    for nid in ids:
        await wait_status(client, nid, "sent")
    [text] = await sandbox_for(client, ids[0])
    assert text["recipient"] == "+14155550100" and "424242" in text["body"]
    [note] = await sandbox_for(client, ids[1])
    assert note["recipient"] == token and note["channel"] == "push"


async def test_inline_content_is_rendered_and_sent(stack: Stack, client: httpx.AsyncClient) -> None:
    body = email_send(
        template=None, content={"subject": "Hi {{ name }}", "body": "Hello {{ name }}"}, data={"name": "Ada"}
    )
    nid = (await client.post("/v1/notifications", json=body)).json()["id"]
    await wait_status(client, nid, "sent")
    [message] = await sandbox_for(client, nid)
    assert (message["subject"], message["body"]) == ("Hi Ada", "Hello Ada")


async def test_known_user_id_can_be_used_after_an_inline_user(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    await client.post("/v1/notifications", json=email_send(user={"id": "u-known", "email": "k@example.com"}))
    nid = (await client.post("/v1/notifications", json=email_send(user=None, user_id="u-known"))).json()["id"]
    await wait_status(client, nid, "sent")
    assert (await sandbox_for(client, nid))[0]["recipient"] == "k@example.com"


async def test_repeated_event_id_sends_once(stack: Stack, client: httpx.AsyncClient) -> None:
    body = email_send()
    ids = {(await client.post("/v1/notifications", json=body)).json()["id"] for _ in range(3)}
    assert len(ids) == 1
    nid = ids.pop()
    await wait_status(client, nid, "sent")
    assert len(await sandbox_for(client, nid)) == 1


async def test_redelivered_message_for_a_sent_notification_makes_no_provider_call(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    from schema.messages import NotificationMessage

    nid = (await client.post("/v1/notifications", json=email_send())).json()["id"]
    await wait_status(client, nid, "sent")
    worker = stack.workers[next(iter(stack.workers))]
    row = await status_of(client, nid)
    assert row["status"] == "sent"
    # Publish the same message again, twice, as Kafka redelivery or the relay would.
    from uuid import UUID

    from clarion.kafka import Publisher

    publisher = Publisher(worker.settings.kafka_bootstrap or "")
    assert worker.pipeline is not None
    user_id, tenant_id = await worker.pipeline.pool.fetchrow(
        "SELECT user_id, tenant_id FROM notifications WHERE id = $1", UUID(nid)
    )
    message = NotificationMessage(id=UUID(nid), tenant_id=tenant_id, channel="email", user_id=user_id)
    assert len(await publisher.publish_many([message, message])) == 2
    await publisher.close()
    marker = (await client.post("/v1/notifications", json=email_send())).json()["id"]
    await wait_status(client, marker, "sent")  # the worker has consumed past the redelivered copies
    assert len(await sandbox_for(client, nid)) == 1
    assert len((await status_of(client, nid))["delivery_attempts"]) == 1
