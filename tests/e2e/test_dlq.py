"""Dead letters end to end: a permanently failing provider ends in the DLQ; a redrive after it
recovers delivers. Runs on the suite's SMS lane (`tests.fixtures.sms_lane`)."""

from __future__ import annotations

import httpx

from tests.fixtures.delivery import wait_status
from tests.fixtures.sms_lane import Lane, read_topic, send


async def test_permanently_failing_provider_ends_dead_in_the_dlq_and_redrive_after_recovery_sends(
    sms_lane: Lane, lane_client: httpx.AsyncClient
) -> None:
    sms_lane.fake.force_server_error(1000, status=500)
    nid = await send(lane_client)

    dead = await wait_status(lane_client, nid, "dead")

    assert dead["attempts"] == 5 == len(dead["delivery_attempts"]), "the lane's max_attempts"
    assert dead["error"]["code"] == "20500"
    listed = (await lane_client.get("/v1/ops/dlq/sms")).json()
    [item] = listed["items"]
    assert (item["id"], item["attempts"], item["provider"]) == (nid, 5, "twilio")
    assert item["error"]["code"] == "20500" and "Twilio refused" in item["error"]["message"]
    record = await read_topic(
        sms_lane.broker.bootstrap, "notifications.sms.dlq", lambda d: d.get("id") == nid
    )
    assert record["status"] == "dead" and record["error"]["code"] == "20500"

    sms_lane.fake.reset()  # the provider recovers
    redriven = await lane_client.post("/v1/ops/dlq/sms/redrive", json={})
    assert redriven.status_code == 200, redriven.text
    assert redriven.json()["requeued"] == 1

    body = await wait_status(lane_client, nid, "sent")
    assert body["attempts"] == 1, "a redrive starts the attempt count again"
    assert body["delivery_attempts"][-1]["outcome"] == "sent"
    assert (await lane_client.get("/v1/ops/dlq/sms")).json()["items"] == []


async def test_dlq_pages_and_redrive_filters_select_what_they_name(
    sms_lane: Lane, lane_client: httpx.AsyncClient
) -> None:
    sms_lane.fake.force_server_error(1000, status=500)
    ids = [await send(lane_client) for _ in range(2)]
    for nid in ids:
        await wait_status(lane_client, nid, "dead")

    first = (await lane_client.get("/v1/ops/dlq/sms", params={"limit": 1})).json()
    second = (
        await lane_client.get("/v1/ops/dlq/sms", params={"limit": 1, "cursor": first["next_cursor"]})
    ).json()
    assert {first["items"][0]["id"], second["items"][0]["id"]} == set(ids)
    assert second["next_cursor"] is None

    unmatched = await lane_client.post("/v1/ops/dlq/sms/redrive", json={"error_code": "21211"})
    assert unmatched.json()["requeued"] == 0
    other_provider = await lane_client.post("/v1/ops/dlq/sms/redrive", json={"provider": "sendgrid"})
    assert other_provider.json()["requeued"] == 0
    assert len((await lane_client.get("/v1/ops/dlq/sms")).json()["items"]) == 2

    sms_lane.fake.reset()
    matched = await lane_client.post(
        "/v1/ops/dlq/sms/redrive", json={"error_code": "20500", "provider": "twilio"}
    )
    assert matched.json() == {"requeued": 2, "published": 2, "remaining": 0}
    for nid in ids:
        await wait_status(lane_client, nid, "sent")


async def test_redrive_needs_the_admin_scope(sms_lane: Lane) -> None:
    from tests.conftest import make_tenant

    reader = await make_tenant(sms_lane.engine, scopes=("send", "read"))
    async with httpx.AsyncClient(
        base_url=sms_lane.api.url, headers={"Authorization": f"Bearer {reader.key}"}
    ) as client:
        assert (await client.get("/v1/ops/dlq/sms")).status_code == 200
        refused = await client.post("/v1/ops/dlq/sms/redrive", json={})
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden"
