"""Throttling through the whole stack: rules made over the API, enforced by the running workers."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Any

import httpx

from harness.services import wait_until
from tests.conftest import Stack
from tests.fixtures.delivery import sandbox_for, status_of, wait_status
from tests.fixtures.rules import wait_workers_see
from tests.fixtures.sends import email_send


def push_to(user_id: str, **overrides: Any) -> dict[str, Any]:
    device = {
        "platform": "apns",
        "token": user_id.encode().hex().ljust(64, "0"),
    }  # one device: one call per send
    return email_send(channel="push", user={"id": user_id, "devices": [device]}, **overrides)


async def add_rule(stack: Stack, client: httpx.AsyncClient, **fields: Any) -> None:
    response = await client.post("/v1/rate-limits", json=fields)
    assert response.status_code == 201, response.text
    rule_id = response.json()["id"]
    await wait_workers_see(stack, lambda snapshot: any(str(r.id) == rule_id for r in snapshot.rules))


async def cap_push(stack: Stack, client: httpx.AsyncClient, name: str, **fields: Any) -> None:
    """A frequency cap on the push notifications one recipient gets (``limit`` per ``period_s``)."""
    await add_rule(stack, client, name=name, scope="recipient", channel="push", **fields)


async def send(client: httpx.AsyncClient, body: dict[str, Any]) -> str:
    response = await client.post("/v1/notifications", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def at(body: dict[str, Any], status: str) -> datetime:
    return datetime.fromisoformat(next(h["at"] for h in body["history"] if h["status"] == status))


async def wait_final(client: httpx.AsyncClient, nid: str, timeout_s: float = 15) -> dict[str, Any]:
    async def final() -> dict[str, Any] | None:
        body = await status_of(client, nid)
        return body if body["status"] in ("sent", "throttled", "failed", "duplicate") else None

    return dict(await wait_until(final, timeout_s))


async def test_a_cap_of_two_push_per_minute_with_drop_throttles_the_third_but_not_a_critical_one(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    await cap_push(stack, client, "2-push-per-minute", limit=2, period_s=60, action="drop")
    ids = []
    for _ in range(3):
        ids.append(await send(client, push_to("u-capped")))
        await wait_final(client, ids[-1])
    bodies = [await status_of(client, nid) for nid in ids]
    assert [b["status"] for b in bodies] == ["sent", "sent", "throttled"]
    third = bodies[2]
    assert third["error"]["code"] == "rate_limited"
    assert third["history"][-1]["detail"] == "rule 2-push-per-minute"
    assert await sandbox_for(client, ids[2]) == []
    critical = await send(client, push_to("u-capped", priority="critical"))
    await wait_status(client, critical, "sent")
    other_user = await send(client, push_to("u-other"))
    await wait_status(client, other_user, "sent")


async def test_a_cap_with_delay_sends_the_third_after_the_window_and_not_before(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    window_s = 3
    await cap_push(stack, client, "2-per-3s", limit=2, period_s=window_s, action="delay")
    ids = []
    for _ in range(3):
        ids.append(await send(client, push_to("u-delayed")))
        await wait_final(client, ids[-1])
    first, _, third = [await status_of(client, nid) for nid in ids]
    assert third["status"] == "sent"
    delayed = [h for h in third["history"] if h["status"] == "delayed"]
    assert delayed and delayed[0]["detail"] == "rule 2-per-3s"
    assert len(delayed) <= 2, "re-published when due, not in a loop"
    # the cap admitted the first no earlier than its claim; the third only a full window later
    assert (at(third, "sent") - at(first, "sending")).total_seconds() >= window_s - 0.05
    assert len(await sandbox_for(client, ids[2])) == 1  # sent once, however often it was held


async def test_a_hold_past_the_horizon_ends_throttled_instead_of_delayed_for_a_month(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    """core/horizon.py: a held send keeps its day of the log, so a hold past 30 days is not made."""
    await cap_push(stack, client, "1-per-31-days", limit=1, period_s=31 * 24 * 3600, action="delay")
    first = await send(client, push_to("u-monthly"))
    await wait_status(client, first, "sent")
    second = await wait_final(client, await send(client, push_to("u-monthly")))
    assert second["status"] == "throttled" and second["error"]["code"] == "rate_limited"
    assert "past 30 days" in second["error"]["message"]
    assert not [h for h in second["history"] if h["status"] == "delayed"]
    assert await sandbox_for(client, second["id"]) == []


async def test_provider_pacing_spaces_calls_to_the_provider(stack: Stack, client: httpx.AsyncClient) -> None:
    await add_rule(
        stack,
        client,
        name="sandbox-1-per-s",
        scope="provider",
        provider="sandbox",
        limit=1,
        period_s=1,
        action="delay",
    )
    bodies = [email_send(channel="sms", template="otp", data={"code": str(i)}) for i in range(3)]
    ids = [await send(client, b) for b in bodies]
    for nid in ids:
        await wait_status(client, nid, "sent", timeout_s=20)
    calls = [(await sandbox_for(client, nid))[0]["created_at"] for nid in ids]
    times = sorted(datetime.fromisoformat(c) for c in calls)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    assert all(g >= 0.95 for g in gaps), gaps


async def test_an_elastic_cap_sends_above_its_limit_until_the_provider_has_nothing_to_spare(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    # an hour-long pacing that does not refill during the test: 4 calls, then nothing to spare
    await add_rule(
        stack, client, name="sandbox-4-per-hour", scope="provider", provider="sandbox", limit=4, period_s=3600
    )
    await cap_push(
        stack, client, "1-push-per-hour-elastic", limit=1, period_s=3600, action="drop", mode="elastic"
    )
    ids = []
    for user in ("u-elastic", "u-elastic", "u-neighbour", "u-elastic"):
        ids.append(await send(client, push_to(user)))
        await wait_final(client, ids[-1])

    bodies = [await status_of(client, nid) for nid in ids]
    # 2nd: over the cap, borrowed (2 of the provider's 4 calls used); 3rd: another user's own
    # allowance; 4th: the provider's last call leaves nothing to spare, so the cap holds
    assert [b["status"] for b in bodies] == ["sent", "sent", "sent", "throttled"]
    assert bodies[3]["history"][-1]["detail"] == "rule 1-push-per-hour-elastic"
    assert [len(await sandbox_for(client, nid)) for nid in ids] == [1, 1, 1, 0]
