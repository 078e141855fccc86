"""Provider callbacks about a notification whose row is held (``api/callback_gate.py``): they take
their turns and wait a bounded time for the row, then answer ``429 callback_busy``, so however many
arrive at once they never take the pooled connections another tenant's sends need; a replay of a
report already recorded is answered without the row's lock at all.

Before, each waited on the row's lock holding a pooled connection: 40 at once took the pool, and
another tenant's accept waited as long as the row was held."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from uuid import UUID

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.callback_gate import SENDGRID, SENDGRID_AT_ONCE
from api.sendgrid_events import CHUNK_EVENTS, MAX_HISTORY_EVENTS
from harness.services import api_client, wait_until
from tests.conftest import TenantInfo, make_tenant
from tests.fixtures.answers import assert_error
from tests.fixtures.hooked_api import hooks_fixture, provider_transitions  # noqa: F401 - hooks
from tests.fixtures.hooks import SENDGRID_PATH, Hooks, callback, event, sent_notification, sent_sms, view


@contextlib.asynccontextmanager
async def held(engine: AsyncEngine, nid: str) -> AsyncIterator[None]:
    """The notification's row locked (``FOR UPDATE``) by another transaction while inside."""
    async with engine.connect() as conn, conn.begin():
        await conn.execute(sa.text("SELECT 1 FROM notifications WHERE id = :id FOR UPDATE"), {"id": nid})
        yield


async def lock_waiters(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int(
            await conn.scalar(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            )
        )


async def accepted(url: str, tenant: TenantInfo) -> int:
    """Another tenant's send through the same API: its status code."""
    body = {
        "event_id": f"e-{secrets.token_hex(6)}",
        "user": {"id": "b-1", "email": "b1@example.com"},
        "channel": "email",
        "content": {"subject": "Your order", "body": "Shipped."},
    }
    async with api_client(url, tenant.key) as client:
        return (await client.post("/v1/notifications", json=body)).status_code


def assert_busy(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "callback_busy"
    assert response.headers["Retry-After"] == "1"


async def test_a_twilio_report_on_a_held_sms_is_a_429_and_a_retry_records_it(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    sid, nid, _ = await sent_sms(engine, tenant)

    async with held(engine, nid):
        assert_busy(await hooks.twilio(callback(sid, "delivered")))
    retried = await hooks.twilio(callback(sid, "delivered"))

    assert retried.status_code == 200 and retried.json()["recorded"] == 1
    assert provider_transitions(await view(client, nid)) == ["delivered"]


async def test_a_replayed_twilio_report_is_answered_without_the_sms_row(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    sid, nid, _ = await sent_sms(engine, tenant)
    assert (await hooks.twilio(callback(sid, "delivered"))).json()["recorded"] == 1

    async with held(engine, nid):
        replayed = await hooks.twilio(callback(sid, "delivered"))

    assert replayed.status_code == 200 and replayed.json()["duplicate"] == 1


async def test_twilio_reports_queued_on_a_held_sms_leave_the_pool_to_another_tenant(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    sid, nid, _ = await sent_sms(engine, tenant)
    other = await make_tenant(engine)

    async with held(engine, nid):
        calls = [asyncio.create_task(hooks.twilio(callback(sid, "delivered"))) for _ in range(40)]
        await wait_until(lambda: lock_waiters(engine))
        sent = await accepted(hooks.server.url, other)
    answers = await asyncio.gather(*calls)

    assert sent == 202
    assert {r.status_code for r in answers} <= {200, 429}
    assert sum(r.status_code == 200 and r.json()["recorded"] for r in answers) <= 1
    assert (await hooks.twilio(callback(sid, "delivered"))).status_code == 200
    assert provider_transitions(await view(client, nid)) == ["delivered"]


async def test_a_sendgrid_batch_naming_a_held_email_is_a_429_and_its_retry_records_it(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    batch = [event(nid, "delivered", f"{external_id}@example.com")]

    async with held(engine, nid):
        assert_busy(await hooks.events(batch))
    retried = await hooks.events(batch)

    assert retried.status_code == 200 and retried.json()["recorded"] == 1
    assert provider_transitions(await view(client, nid)) == ["delivered"]


async def test_sendgrid_batches_queued_on_a_held_email_leave_the_pool_to_another_tenant(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    batch = [event(nid, "deferred", f"{external_id}@example.com")]
    other = await make_tenant(engine)

    async with held(engine, nid):
        calls = [asyncio.create_task(hooks.events(batch)) for _ in range(40)]
        await wait_until(lambda: lock_waiters(engine))
        sent = await accepted(hooks.server.url, other)
    answers = await asyncio.gather(*calls)

    assert sent == 202
    assert {r.status_code for r in answers} <= {200, 429}
    assert provider_transitions(await view(client, nid)).count("deferred") <= 1


async def test_a_big_batch_holds_its_emails_a_chunk_at_a_time(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    """The emails of a batch's first ``CHUNK_EVENTS`` events are recorded, and free, before a
    later one's row is waited for: a batch refused part way keeps them, and its retry records the
    rest once."""
    first, first_user = await sent_notification(engine, tenant, channel="email")
    later, later_user = await sent_notification(engine, tenant, channel="email")
    if UUID(first) > UUID(later):  # chunks take the emails in id order
        (first, first_user), (later, later_user) = (later, later_user), (first, first_user)
    batch = [event(first, "deferred", f"{first_user}@example.com") for _ in range(CHUNK_EVENTS)]
    batch.append(event(later, "delivered", f"{later_user}@example.com"))

    async with held(engine, later):
        assert_busy(await hooks.events(batch))
        recorded_meanwhile = provider_transitions(await view(client, first))
    retried = (await hooks.events(batch)).json()

    assert recorded_meanwhile == ["deferred"] * MAX_HISTORY_EVENTS
    assert (retried["recorded"], retried["duplicate"]) == (1, MAX_HISTORY_EVENTS)
    assert provider_transitions(await view(client, later)) == ["delivered"]


async def test_a_signed_twilio_callback_with_a_sid_longer_than_twilios_is_a_400(hooks: Hooks) -> None:
    """A sid is looked up and used as a turn's key: one of 1,000 characters (the body's limit
    allows some 60,000), signed with a leaked auth token, is refused before either."""
    response = await hooks.twilio(callback("SM" + "f" * 1_000, "delivered"))

    assert_error(response, 400, "invalid_callback")


async def test_a_sendgrid_batch_that_gets_no_turn_is_refused_before_it_is_parsed(hooks: Hooks) -> None:
    """Under a flood most batches wait for a turn in vain, and each parsed its events first (~9 ms
    of the event loop for 2,000, every other request waiting behind it): one that gets no turn is a
    429 whatever it holds, here a body that is not JSON at all; with a turn it is read (a 400)."""
    gate = hooks.server.app.state.callback_gate
    payload = b'[{"event": "open", ' * 1000
    headers = hooks.sendgrid.signed_headers(payload)

    async with httpx.AsyncClient(base_url=hooks.server.url, timeout=10) as sender:
        async with contextlib.AsyncExitStack() as turns:
            for _ in range(SENDGRID_AT_ONCE):  # every SendGrid turn of the process, held
                assert await turns.enter_async_context(gate.sendgrid.turn(SENDGRID))
            without_a_turn = await sender.post(SENDGRID_PATH, content=payload, headers=headers)
        with_a_turn = await sender.post(SENDGRID_PATH, content=payload, headers=headers)

    assert_busy(without_a_turn)
    assert_error(with_a_turn, 400, "malformed_json")
