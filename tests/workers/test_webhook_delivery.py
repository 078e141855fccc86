"""Outbound webhooks end to end: a notification's outcome reaches the tenant's real HTTP receiver,
signed (verified with the ``standardwebhooks`` package), through 500s, timeouts, an open breaker,
a failure streak that disables the endpoint, replays, and a URL that turned private."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from standardwebhooks import Webhook

from clarion.retry_settings import BreakerSettings
from clarion.settings import Settings
from core import ssrf
from harness.services import wait_until
from harness.tenants import TenantInfo
from tests.conftest import Stack
from tests.fixtures.db import scalar
from tests.fixtures.hooks import sent_notification
from tests.fixtures.sends import email_send
from tests.fixtures.webhook_receiver import Receiver
from tests.fixtures.webhooks import deliveries, emit, fast, register, sender

OPENED = ["notification.opened"]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = await Receiver().start()
    yield r
    await r.stop()


async def _endpoint(local: httpx.AsyncClient, receiver: Receiver, types: list[str] | None = None) -> str:
    created = await register(local, receiver.url, types)
    receiver.secrets = [created["secret"]]
    return str(created["id"])


async def test_a_sent_notification_reaches_the_endpoint_signed_once(
    stack: Stack, client: httpx.AsyncClient, local: httpx.AsyncClient, receiver: Receiver, settings: Settings
) -> None:
    endpoint_id = await _endpoint(local, receiver)
    send = email_send()
    nid = (await client.post("/v1/notifications", json=send)).json()["id"]
    # A call's time limit and lease roomy for a loaded machine: this test is about what arrives and
    # its signature. With fast()'s 1 s and 3 s, a clean-clone CI run once saw two
    # notification.sent arrive here (which, or why, the run did not keep).
    async with sender(settings, fast(settings, timeout_s=10.0, lease_s=30.0)):
        await wait_until(lambda: receiver.of_type("notification.sent"), 30)
        rows = await wait_until(lambda: _delivered(local, endpoint_id), 10)
    sent = receiver.of_type("notification.sent")
    assert len(sent) == 1, [(e.msg_id, e.data) for e in sent]
    [event] = sent
    assert event.data["notification_id"] == nid
    assert event.data["event_id"] == send["event_id"]
    assert (event.data["channel"], event.data["status"], event.data["provider"]) == (
        "email",
        "sent",
        "sandbox",
    )
    assert event.timestamp.endswith("Z")
    assert receiver.unverified == 0 and receiver.duplicates() == 0
    assert [(r["state"], r["attempts"], r["last_status"]) for r in rows] == [("delivered", 1, 204)]


async def _delivered(
    local: httpx.AsyncClient, endpoint_id: str, n: int | None = None
) -> list[dict[str, object]] | None:
    """The endpoint's deliveries once every one (``n`` of them, if given) is recorded delivered."""
    rows = await deliveries(local, endpoint_id)
    done = rows and all(r["state"] == "delivered" for r in rows) and (n is None or len(rows) == n)
    return rows if done else None


async def test_500s_and_timeouts_are_retried_and_a_late_answer_is_a_counted_duplicate(
    local: httpx.AsyncClient, receiver: Receiver, settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    endpoint_id = await _endpoint(local, receiver, OPENED)
    receiver.fail_next, receiver.hang_next, receiver.slow_next = 2, 1, 1
    await emit(engine, tenant.id)
    async with sender(settings, fast(settings)):
        rows = await wait_until(lambda: _delivered(local, endpoint_id), 30)
    # 500, 500, hang (timeout), taken in but answered late (timeout), then a 204.
    assert receiver.calls == 5
    assert [r["attempts"] for r in rows] == [5]
    assert len(receiver.counts()) == 1 and receiver.duplicates() == 1
    assert receiver.unverified == 0


async def test_an_endpoint_failing_long_enough_is_disabled_and_says_why(
    local: httpx.AsyncClient, receiver: Receiver, settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    endpoint_id = await _endpoint(local, receiver, OPENED)
    receiver.status = 500
    await emit(engine, tenant.id, n=2)
    await emit(engine, tenant.id, "notification.clicked")  # not subscribed: never sent
    async with sender(settings, fast(settings, disable_after_failures=4, disable_after_s=0.0)):

        async def disabled() -> dict[str, object] | None:
            body = (await local.get(f"/v1/webhook-endpoints/{endpoint_id}")).json()
            return body if not body["enabled"] else None

        body = await wait_until(disabled, 30)
        calls = receiver.calls
        assert calls >= 4
        rows = await deliveries(local, endpoint_id)
        assert {r["event_type"] for r in rows} == {"notification.opened"}
        await emit(engine, tenant.id)  # a disabled endpoint gets no new delivery
        assert len(await deliveries(local, endpoint_id)) == 2
        parked = await deliveries(local, endpoint_id)
        assert [(r["state"], r["next_attempt_at"]) for r in parked] == [("pending", None)] * 2, parked
        assert receiver.calls == calls  # nothing was sent to it after it was disabled
        # Fixed and enabled again: the deliveries it missed go out.
        receiver.status = 204
        enabled = (await local.patch(f"/v1/webhook-endpoints/{endpoint_id}", json={"enabled": True})).json()
        assert (enabled["enabled"], enabled["disabled_reason"], enabled["failure_streak"]) == (True, None, 0)
        await wait_until(lambda: _delivered(local, endpoint_id), 30)
    assert "4 consecutive failed deliveries" in str(body["disabled_reason"])
    assert "HTTP 500" in str(body["disabled_reason"])
    assert body["failure_streak"] == 4 and body["disabled_at"] is not None
    assert len(receiver.counts()) == 2


async def test_replay_from_a_time_or_an_event_resends_with_the_same_webhook_id(
    local: httpx.AsyncClient, receiver: Receiver, settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    endpoint_id = await _endpoint(local, receiver, OPENED)
    since = (await local.get(f"/v1/webhook-endpoints/{endpoint_id}")).json()["created_at"]
    await emit(engine, tenant.id, n=2)
    # Each replay waits for the deliveries to be recorded, not only received: the receiver keeps a
    # call before it answers, and a replay adds nothing for an event still pending to the endpoint.
    async with sender(settings, fast(settings)):
        await wait_until(lambda: _delivered(local, endpoint_id, 2), 30)
        replayed = await local.post(f"/v1/webhook-endpoints/{endpoint_id}/replay", json={"since": since})
        assert replayed.status_code == 202, replayed.text
        assert replayed.json() == {"replayed": 2, "next_since": None}
        await wait_until(lambda: _delivered(local, endpoint_id, 4), 30)
        first = receiver.received[0].msg_id
        one = await local.post(f"/v1/webhook-endpoints/{endpoint_id}/replay", json={"event_id": first})
        assert one.json()["replayed"] == 1
        await wait_until(lambda: len(receiver.received) == 5, 30)
    assert receiver.counts()[first] == 3 and len(receiver.counts()) == 2
    assert sum(r["replay"] for r in await deliveries(local, endpoint_id)) == 3


async def test_after_a_rotation_a_receiver_on_the_old_secret_still_verifies(
    local: httpx.AsyncClient, receiver: Receiver, settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    endpoint_id = await _endpoint(local, receiver, OPENED)
    new = (await local.post(f"/v1/webhook-endpoints/{endpoint_id}/rotate-secret")).json()["secret"]
    await emit(engine, tenant.id)
    async with sender(settings, fast(settings)):
        await wait_until(lambda: receiver.received, 30)
    assert receiver.unverified == 0  # the receiver holds only the old secret
    [call] = receiver.received
    assert len(call.signature.split(" ")) == 2
    assert Webhook(new).verify(call.body, call.headers)["type"] == "notification.opened"


async def test_a_url_that_now_resolves_inside_is_refused_at_send(
    local: httpx.AsyncClient, receiver: Receiver, settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    # Registered while 127.0.0.1 was allowed; the sender's allow-list no longer names it, which is
    # what a DNS answer changed to a private address after registration looks like to it.
    endpoint_id = await _endpoint(local, receiver, OPENED)
    await emit(engine, tenant.id)
    async with sender(settings, fast(settings, allow=ssrf.NOBODY)):

        async def refused() -> list[dict[str, object]] | None:
            rows = await deliveries(local, endpoint_id)
            return rows if rows and rows[0]["last_error"] else None

        rows = await wait_until(refused, 30)
    assert str(rows[0]["last_error"]).startswith("url_not_allowed")
    assert rows[0]["state"] == "pending" and receiver.calls == 0


async def test_an_open_breaker_defers_one_endpoint_without_calls_while_another_is_served(
    local: httpx.AsyncClient, settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    failing, healthy = await Receiver().start(), await Receiver().start()
    try:
        failing.status = 500
        bad = await _endpoint(local, failing, OPENED)
        await _endpoint(local, healthy, OPENED)
        breaker = BreakerSettings(enabled=True, failure_rate=0.5, window_s=60, min_calls=2, cool_down_s=120)
        await emit(engine, tenant.id, n=5)
        async with sender(settings, fast(settings, breaker=breaker, concurrency=1)):
            await wait_until(lambda: len(healthy.received) == 5, 30)

            async def deferred() -> int:
                return int(
                    await scalar(
                        engine,
                        "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = :e"
                        " AND state = 'pending' AND next_attempt_at > now() + interval '60 seconds'",
                        e=bad,
                    )
                )

            await wait_until(lambda: deferred(), 30)
            await wait_until(lambda: _settled(engine, bad), 30)
        assert failing.calls == 2  # the breaker opened after two failed calls; the rest waited
    finally:
        await failing.stop()
        await healthy.stop()


async def _settled(engine: AsyncEngine, endpoint_id: str) -> bool:
    """Every pending delivery of the endpoint waits well into the future (none is due or in flight)."""
    due = await scalar(
        engine,
        "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = :e AND state = 'pending'"
        " AND next_attempt_at < now() + interval '5 seconds'",
        e=endpoint_id,
    )
    return due == 0


async def test_an_engagement_report_is_one_event_and_its_replay_none(
    local: httpx.AsyncClient, receiver: Receiver, settings: Settings, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    await _endpoint(local, receiver, ["notification.opened", "notification.clicked"])
    nid, _ = await sent_notification(engine, tenant, channel="push")
    for _ in range(2):  # the second is the same report again: not counted, no event
        response = await local.post(f"/v1/notifications/{nid}/events", json={"type": "opened"})
        assert response.status_code == 200, response.text
    clicked = {"type": "clicked", "link": "https://example.com/a"}
    assert (await local.post(f"/v1/notifications/{nid}/events", json=clicked)).status_code == 200
    async with sender(settings, fast(settings)):
        await wait_until(lambda: len(receiver.received) == 2, 30)
    assert sorted(r.type for r in receiver.received) == ["notification.clicked", "notification.opened"]
    [click] = receiver.of_type("notification.clicked")
    assert click.data == {
        "notification_id": nid,
        "type": "clicked",
        "link": "https://example.com/a",
        "source": "api",
    }
    assert await scalar(engine, "SELECT count(*) FROM webhook_events WHERE notification_id = :n", n=nid) == 2
