"""One notification's fault ends that notification alone: its neighbours in the same batch are
sent exactly once, and the faulty one is recorded ``failed`` with ``internal_error``.

The fault is injected into the running worker (a gate that raises for one event id), as the
issue's poisoned SMS did through ``sms_segments``: whatever raises, the mechanism is the same."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
import sqlalchemy as sa

from clarion.pg import create_pool
from harness.services import api_client, wait_until
from schema.enums import Channel, Status
from schema.messages import NotificationMessage
from tests.conftest import Stack, TenantInfo, make_tenant
from tests.fixtures.delivery import sandbox_for, status_of, wait_status
from tests.fixtures.poison import ExplodingGate
from tests.fixtures.sends import held_back
from workers.claim import claim
from workers.outcome import Attempt, Outcome
from workers.record import record_outcomes


def sms(event_id: str, n: int) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "user": {"id": f"u-{n}", "phone": f"+1415555{n:04d}"},
        "channel": "sms",
        "content": {"body": "Your code is {{ code }}"},
        "data": {"code": str(n)},
    }


async def test_a_notification_that_raises_fails_alone_and_its_neighbours_are_sent_once(
    stack: Stack, api: Any, engine: Any, client: httpx.AsyncClient
) -> None:
    pipeline = stack.workers[Channel.sms].pipeline
    assert pipeline is not None
    gate = ExplodingGate()
    pipeline.gates.append(gate)
    other: TenantInfo = await make_tenant(engine)
    try:
        async with api_client(api.url, other.key) as neighbour:
            run = secrets.token_hex(3)
            sends = [neighbour.post("/v1/notifications", json=sms(f"n-{run}-{i}", i)) for i in range(20)]
            sends.append(client.post("/v1/notifications", json=sms(f"poison-{run}", 99)))
            answers = await asyncio.gather(*sends)
            assert all(a.status_code == 202 for a in answers), [a.text for a in answers]
            ids = [a.json()["id"] for a in answers]
            poison = await wait_status(client, ids[-1], "failed")
            for nid in ids[:-1]:
                await wait_status(neighbour, nid, "sent")
            for nid in ids[:-1]:
                assert len(await sandbox_for(neighbour, nid)) == 1
    finally:
        pipeline.gates.remove(gate)
    assert poison["error"]["code"] == "internal_error"
    assert "UnicodeEncodeError" in poison["error"]["message"]
    assert poison["delivery_attempts"][-1]["error_message"] == "UnicodeEncodeError"
    assert await sandbox_for(client, ids[-1]) == []


async def test_a_notification_claimed_max_claims_times_without_an_outcome_goes_dead(
    stack: Stack, engine: Any, client: httpx.AsyncClient
) -> None:
    """As if workers had died on it ``max_claims`` times: the next claim ends it, with no send."""
    send = sms(f"doomed-{secrets.token_hex(3)}", 7)
    send["send_at"] = held_back()  # held back until the test has set its claims
    accepted = await client.post("/v1/notifications", json=send)
    assert accepted.status_code == 202, accepted.text
    nid = accepted.json()["id"]
    max_claims = stack.workers[Channel.sms].settings.max_claims
    async with engine.begin() as conn:
        await conn.execute(
            sa.text("UPDATE notifications SET claims = :c, not_before = now() WHERE id = :id"),
            {"c": max_claims, "id": nid},
        )
    dead = await wait_status(client, nid, "dead")
    assert dead["error"]["code"] == "max_claims"
    assert await sandbox_for(client, nid) == []


async def test_a_recorded_outcome_resets_the_claim_count(
    stack: Stack, engine: Any, client: httpx.AsyncClient
) -> None:
    accepted = await client.post("/v1/notifications", json=sms(f"ok-{secrets.token_hex(3)}", 8))
    nid = accepted.json()["id"]
    await wait_status(client, nid, "sent")
    async with engine.connect() as conn:
        claims = (
            await conn.execute(sa.text("SELECT claims FROM notifications WHERE id = :id"), {"id": nid})
        ).scalar()
    assert claims == 0


async def test_texts_postgresql_refuses_are_recorded_cleaned_instead_of_failing_the_batch_forever(
    stack: Stack, engine: Any, client: httpx.AsyncClient
) -> None:
    """A provider's answer or an exception's text may quote a tenant's data: a NUL, a lone
    surrogate or an over-long code made the batch's recording fail on every retry."""
    send = sms(f"unstorable-{secrets.token_hex(3)}", 9)
    send["send_at"] = held_back()  # no worker takes it; the test records its outcome
    accepted = await client.post("/v1/notifications", json=send)
    assert accepted.status_code == 202, accepted.text
    nid = uuid.UUID(accepted.json()["id"])
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "UPDATE notifications SET status = 'sending', lease_until = now() + interval '1 hour' WHERE id = :id"
            ),
            {"id": nid},
        )
    now = datetime.now(UTC)
    attempt = Attempt(
        notification_id=nid, attempt=1, provider="p" * 40, recipient="+1415\x00\ud800", started_at=now,
        finished_at=now, outcome="permanent", error_code="E" * 100, error_message="to\x00ken \udfff",
    )  # fmt: skip
    outcome = Outcome(
        notification_id=nid, status=Status.failed, calls=1, provider="p" * 40, error_code="E" * 100,
        error_message="bad\x00 \ud800 text", detail="d\x00", attempts=(attempt,),
    )  # fmt: skip
    pool = await create_pool(stack.workers[Channel.sms].settings.database_url, size=1)
    try:
        await asyncio.wait_for(record_outcomes(pool=pool, outcomes=[outcome]), 10)
    finally:
        await pool.close()
    body = await wait_status(client, str(nid), "failed")
    assert body["error"] == {"code": "E" * 64, "message": "bad ? text"}
    [row] = body["delivery_attempts"]
    assert (row["provider"], row["error_code"], row["error_message"]) == ("p" * 32, "E" * 64, "token ?")


async def test_a_row_poisoned_in_the_log_fails_alone_and_another_tenants_batch_is_sent_once(
    stack: Stack, api: Any, engine: Any, client: httpx.AsyncClient
) -> None:
    """No fault injected into the worker: the poison is in the log itself (content without a body,
    as a hand edit or an older writer could leave it). All 21 fall due at once, so the relay
    publishes them together and the worker meets them in the same batches."""
    other: TenantInfo = await make_tenant(engine)
    run = secrets.token_hex(3)
    async with api_client(api.url, other.key) as neighbour:
        later = {"send_at": held_back()}
        sends = [neighbour.post("/v1/notifications", json=sms(f"n-{run}-{i}", i) | later) for i in range(20)]
        sends.append(client.post("/v1/notifications", json=sms(f"poison-{run}", 98) | later))
        answers = await asyncio.gather(*sends)
        assert all(a.status_code == 202 for a in answers), [a.text for a in answers]
        ids = [a.json()["id"] for a in answers]
        async with engine.begin() as conn:
            await conn.execute(
                sa.text("""UPDATE notifications SET content = '{"title": "no body"}' WHERE id = :id"""),
                {"id": ids[-1]},
            )
            await conn.execute(
                sa.text("UPDATE notifications SET not_before = now() WHERE id = ANY(:ids)"),
                {"ids": [uuid.UUID(i) for i in ids]},
            )
        poison = await wait_status(client, ids[-1], "failed", timeout_s=30)
        for nid in ids[:-1]:
            await wait_status(neighbour, nid, "sent", timeout_s=30)
        for nid in ids[:-1]:
            assert len(await sandbox_for(neighbour, nid)) == 1
    assert poison["error"] == {
        "code": "internal_error",
        "message": "KeyError while delivering this notification",
    }
    assert await sandbox_for(client, ids[-1]) == []


async def test_a_notification_whose_worker_dies_on_every_claim_goes_dead_after_max_claims(
    stack: Stack, engine: Any, client: httpx.AsyncClient
) -> None:
    """Each claim counts in the log (the claim's own UPDATE); a worker dying between claim and
    record leaves the count. The claim after ``max_claims`` of them ends it dead, in the DLQ."""
    worker = stack.workers[Channel.sms]
    assert worker.pipeline is not None
    send = sms(f"crashing-{secrets.token_hex(3)}", 6)
    send["send_at"] = held_back()
    accepted = await client.post("/v1/notifications", json=send)
    assert accepted.status_code == 202, accepted.text
    nid = uuid.UUID(accepted.json()["id"])
    async with engine.begin() as conn:  # due now; published_at ahead keeps the relay off it
        tenant_id, user_id = (
            await conn.execute(
                sa.text(
                    "UPDATE notifications SET not_before = now(), published_at = '2099-01-01' WHERE id = :id"
                    " RETURNING tenant_id, user_id"
                ),
                {"id": nid},
            )
        ).one()

    async def claimed() -> bool | None:
        return bool((await claim(pool=worker.pipeline.pool, ids=[nid], lease_s=0.05))[0]) or None

    for _ in range(worker.settings.max_claims):  # claimed, then the "worker" dies: no outcome
        await wait_until(claimed, 5)
    message = NotificationMessage(id=nid, tenant_id=tenant_id, channel=Channel.sms, user_id=user_id)

    async def delivered() -> bool | None:
        await worker._deliver([message])  # the worker's own path: process, record, forward
        return (await status_of(client, str(nid)))["status"] == "dead" or None

    await wait_until(delivered, 5)
    dead = await wait_status(client, str(nid), "dead")
    assert dead["error"]["code"] == "max_claims"
    assert await sandbox_for(client, str(nid)) == []
    listed = (await client.get("/v1/ops/dlq/sms")).json()
    assert str(nid) in [item["id"] for item in listed["items"]]
