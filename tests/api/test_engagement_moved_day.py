"""A report of engagement (and a tracked open) is recorded while a day it writes moves out of a default partition.

A report writes ``engagement`` (the notification's day), ``analytics_hourly`` (its hour) and, for a
tenant with an endpoint, ``webhook_events`` (today). Each keeps a default partition: a row of a day
without its partition lands there, and making the day moves the day's rows out (delete, insert,
attach, under ACCESS EXCLUSIVE on the default: ``schema.partitions._create_days``). A report that
waited for that lock had been routed into the default before the day was attached, and PostgreSQL
refused it: "new row for relation "..._default" violates partition constraint" (SQLSTATE 23514),
an HTTP 500 for a report that was fine. The log's days are made so that this does not arise for
its own tables (``tests/clarion/test_log_day_order.py``); ``clarion webhooks`` makes the webhook
tables' days, and a day of any of them made late (the upkeep stopped, a database from before
those fixes) still moves. The report is then tried once more (``clarion.missing_days``).

Each test makes the race certain: the move's transaction is held open until the report waits
for it (``pg_locks``), then let go."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlencode
from uuid import UUID

import asyncpg
import pytest
from twilio.request_validator import RequestValidator

import api.engagement
import api.sendgrid_events
import api.tracking
import api.webhooks
from api.callback_gate import CallbackGate
from api.engagement import report_engagement
from api.engagement_gate import EngagementGate
from api.engagement_models import EngagementIn
from api.errors import ApiError
from api.sendgrid_events import record_sendgrid_events
from api.tracking import record_hit
from api.webhooks import WebhookResult, record_twilio_status
from clarion.pg import create_pool
from clarion.tracking_tokens import TrackingClaims
from harness.fakes.sendgrid import SIGNATURE_HEADER, TIMESTAMP_HEADER, FakeSendGrid
from harness.services import drop_database, fresh_database, wait_until
from schema.partitions import ensure_ahead
from tests.fixtures.db import LOCK_WAITERS

T = TypeVar("T")
DAY = dt.date(2001, 2, 3)  # the notification's day: long before the migration's days
TODAY = dt.datetime.now(dt.UTC).date()  # webhook events are stamped now()
LINK = "https://example.com/a"
NOTIFICATION = """
INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, data, created_at)
VALUES (gen_random_uuid(), 't', 'e', 'x', $1, 'push', '{}', $2) RETURNING id
"""
ENDPOINT = """
INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, enabled, secret)
VALUES (gen_random_uuid(), 't', 'https://hooks.example.com/', '{notification.opened,notification.clicked}',
        true, 'whsec_x')
"""


@pytest.fixture
async def pool() -> AsyncIterator[asyncpg.Pool]:
    url = await fresh_database("clarion_moved_day")
    p = await create_pool(url, size=4)
    yield p
    await p.close()
    await drop_database(url)


async def _notification(pool: asyncpg.Pool, *, late: str) -> UUID:
    """A notification of ``DAY`` whose ``late`` table has no partition of its day yet (every other
    table has), and whose tenant has an endpoint."""
    async with pool.acquire() as conn:
        await conn.execute("INSERT INTO tenants (id, name) VALUES ('t', 't')")
        await conn.execute(ENDPOINT)
        days = {"notifications": DAY, "engagement": DAY, "analytics_hourly": DAY}
        days |= {"webhook_events": TODAY, "webhook_deliveries": TODAY}
        for parent, day in days.items():
            if parent != late:
                await ensure_ahead(conn, parent=parent, today=day, days_ahead=0)
        user = await conn.fetchval(
            "INSERT INTO users (id, tenant_id, external_id) VALUES (gen_random_uuid(), 't', 'u') RETURNING id"
        )
        noon = dt.datetime.combine(DAY, dt.time(12), tzinfo=dt.UTC)
        return UUID(str(await conn.fetchval(NOTIFICATION, user, noon)))


async def behind_the_move(
    pool: asyncpg.Pool, *, parent: str, day: dt.date, work: Callable[[], Awaitable[T]]
) -> T:
    """``work()`` started while ``parent``'s ``day`` is being made (its rows moved out of the default)
    in a transaction held open until the work waits for it (``pg_locks``); its result once the move
    commits."""
    async with pool.acquire() as mover, mover.transaction():
        await ensure_ahead(mover, parent=parent, today=day, days_ahead=0)
        task = asyncio.create_task(work())

        async def waiting() -> bool:
            return task.done() or bool(await pool.fetchval(LOCK_WAITERS))

        await wait_until(waiting, 15, 0.01)
        assert not task.done()  # it waits for the move
    return await task


@pytest.mark.parametrize(
    ("late", "day"), [("engagement", DAY), ("analytics_hourly", DAY), ("webhook_events", TODAY)]
)
async def test_a_report_waiting_for_its_day_to_move_out_of_the_default_is_recorded(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch, late: str, day: dt.date
) -> None:
    # The report's own lock timeout (1 s) is not what this is about: it waits as long as the test.
    monkeypatch.setattr(api.engagement, "LOCK_TIMEOUT_MS", 30_000)
    gate = EngagementGate(pool_size=4)
    nid = await _notification(pool, late=late)

    async def report(body: EngagementIn) -> api.engagement.EngagementRecorded:
        return await report_engagement(
            pool=pool, gate=gate, tenant_id="t", notification_id=nid, report=body, source="api"
        )

    await report(EngagementIn(type="clicked", link=LINK))  # the late day's first row: into its default
    assert await pool.fetchval(f"SELECT count(*) FROM {late}_default") == 1
    # No link: a click's check of the notification's links would read engagement first and wait
    # there, its upsert then planned after the move.
    recorded = await behind_the_move(
        pool, parent=late, day=day, work=lambda: report(EngagementIn(type="opened"))
    )

    assert (recorded.type, recorded.count, recorded.duplicate) == ("opened", 1, False)
    assert await pool.fetchval(f"SELECT count(*) FROM {late}_default") == 0
    assert await pool.fetchval("SELECT count(*) FROM engagement") == 2
    counts = await pool.fetchrow(
        "SELECT sum(opened) AS opened, sum(clicked) AS clicked FROM analytics_hourly"
    )
    assert (counts["opened"], counts["clicked"]) == (1, 1)
    events = await pool.fetch("SELECT type FROM webhook_events ORDER BY type")
    assert [e["type"] for e in events] == ["notification.clicked", "notification.opened"]


async def test_a_tracked_open_waiting_for_its_day_to_move_out_of_the_default_is_recorded(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The email pixel: a refused hit was a 500 to the mail client, the open lost for good."""
    monkeypatch.setattr(api.tracking, "LOCK_TIMEOUT_MS", 30_000)
    gate = EngagementGate(pool_size=4)
    nid = await _notification(pool, late="engagement")
    ua = "Mozilla/5.0 (Windows NT 10.0; Win64; x64) Thunderbird/128.0"
    await record_hit(pool=pool, gate=gate, claims=TrackingClaims("t", nid, LINK), user_agent=ua)
    await behind_the_move(
        pool, parent="engagement", day=DAY,
        work=lambda: record_hit(pool=pool, gate=gate, claims=TrackingClaims("t", nid, None), user_agent=ua),
    )  # fmt: skip

    rows = await pool.fetch("SELECT type, tableoid::regclass::text AS part FROM engagement ORDER BY type")
    assert [(r["type"], r["part"]) for r in rows] == [
        ("clicked", f"engagement_p{DAY:%Y%m%d}"),
        ("opened", f"engagement_p{DAY:%Y%m%d}"),
    ]


async def test_a_twilio_report_waiting_for_its_day_to_move_out_of_the_default_is_recorded(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twilio does not retry a refused status callback: refused, the delivery report was lost."""
    monkeypatch.setattr(api.webhooks, "LOCK_TIMEOUT_MS", 30_000)
    nid = await _notification(pool, late="engagement")
    sid = "SM" + nid.hex
    await pool.execute(
        "UPDATE notifications SET channel = 'sms', status = 'sent', provider_message_id = $1, history = '[]'",
        sid,
    )
    form = {"MessageSid": sid, "MessageStatus": "delivered", "AccountSid": "AC" + "0" * 32}
    url = "https://clarion.example.com/v1/webhooks/twilio"
    signature = RequestValidator("token").compute_signature(url, form)

    async def report() -> WebhookResult:
        return await record_twilio_status(
            pool=pool, gate=CallbackGate.build(pool_size=4), auth_token="token", url=url,
            body=urlencode(form).encode(), signature=signature,
        )  # fmt: skip

    result = await behind_the_move(pool, parent="engagement", day=DAY, work=report)

    assert result.recorded == 1
    rows = await pool.fetch("SELECT type, tableoid::regclass::text AS part FROM engagement")
    assert [(r["type"], r["part"]) for r in rows] == [("delivered", f"engagement_p{DAY:%Y%m%d}")]


async def test_a_sendgrid_batch_waiting_for_its_day_to_move_out_of_the_default_is_a_429_its_retry_records(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SendGrid retries a refused batch: the refusal is its 429 (not a 500), and the retry records
    every event once."""
    monkeypatch.setattr(api.sendgrid_events, "LOCK_TIMEOUT_MS", 30_000)
    nid = await _notification(pool, late="engagement")
    await pool.execute("UPDATE notifications SET channel = 'email', status = 'sent', history = '[]'")
    await pool.execute("UPDATE users SET email = 'u@example.com'")
    sendgrid = FakeSendGrid()
    open_ = {"event": "open", "sg_event_id": "ev-1", "email": "u@example.com", "timestamp": 981201600}
    payload = json.dumps([open_ | {"notification_id": str(nid)}]).encode()

    async def batch() -> WebhookResult:
        headers = sendgrid.signed_headers(payload)
        return await record_sendgrid_events(
            pool=pool, gate=CallbackGate.build(pool_size=4), public_key=sendgrid.public_key, payload=payload,
            signature=headers[SIGNATURE_HEADER], timestamp=headers[TIMESTAMP_HEADER],
        )  # fmt: skip

    with pytest.raises(ApiError) as refused:
        await behind_the_move(pool, parent="engagement", day=DAY, work=batch)
    assert (refused.value.status, refused.value.code) == (429, "callback_busy")
    assert await pool.fetchval("SELECT count(*) FROM engagement") == 0  # nothing of it kept

    assert (await batch()).duplicate == 0
    rows = await pool.fetch("SELECT type, count, tableoid::regclass::text AS part FROM engagement")
    assert [tuple(r) for r in rows] == [("opened", 1, f"engagement_p{DAY:%Y%m%d}")]
    assert (await batch()).duplicate == 1  # SendGrid's repeat of it counts nothing more
