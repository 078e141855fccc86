"""``core.engagement.record_engagement`` over the real database: a batch's events of one row fold in
order (replays of each other, the cap, first/last, the first reporter), exactly as one at a time
would; the first events of a type count once in the rollups and each counted one is a webhook
event; concurrent batches count a report once; and a batch costs a few statements, not one or
more per event."""

from __future__ import annotations

import asyncio
import random
import secrets
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from clarion.pg import asyncpg_dsn
from core import engagement, webhook_events
from core.engagement import MAX_COUNTED, EngagementEvent, Recorded, record_engagement
from core.webhook_events import WebhookEventIn
from harness.services import wait_until
from schema.enums import EngagementType
from tests.fixtures.db import rolled_back

SENT = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection in a transaction rolled back after the test, with a tenant of its own."""
    async with rolled_back(database_url, tenant_id="t-engaged") as connection:
        yield connection


async def _notification(conn: asyncpg.Connection, tenant: str = "t-engaged") -> uuid.UUID:
    user = await conn.fetchval(
        "INSERT INTO users (id, tenant_id, external_id) VALUES (gen_random_uuid(), $1, $2) RETURNING id",
        tenant,
        secrets.token_hex(6),
    )
    nid: uuid.UUID = await conn.fetchval(
        "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, category,"
        " priority, data, status, attempts, provider, created_at) VALUES (gen_random_uuid(), $1, $2, 'x',"
        " $3, 'email', 'orders', 'normal', '{}', 'sent', 1, 'sendgrid', $4) RETURNING id",
        tenant,
        secrets.token_hex(6),
        user,
        SENT,
    )
    return nid


def _event(
    nid: uuid.UUID, marker: str | None, *, minute: int = 1, type: EngagementType = EngagementType.opened,
    link: str = "", source: str = "sendgrid", tenant: str = "t-engaged",
) -> EngagementEvent:  # fmt: skip
    return EngagementEvent(
        tenant_id=tenant, notification_id=nid, notification_created_at=SENT, type=type,
        at=SENT + timedelta(minutes=minute), source=source, link=link, marker=marker,
    )  # fmt: skip


def _flags(recorded: list[Recorded]) -> list[tuple[str | None, bool, bool]]:
    return [(r.event.marker, r.counted, r.capped) for r in recorded]


async def _rows(conn: asyncpg.Connection, nid: uuid.UUID) -> list[tuple[Any, ...]]:
    rows = await conn.fetch(
        "SELECT type, link, count, seen, first_at, last_at, source FROM engagement"
        " WHERE notification_id = $1 ORDER BY type, link",
        nid,
    )
    return [tuple(r) for r in rows]


async def test_events_of_one_row_fold_in_order_replays_of_each_other_and_the_cap(
    conn: asyncpg.Connection,
) -> None:
    nid = await _notification(conn)
    kept = [f"m{i}" for i in range(MAX_COUNTED - 2)]
    await record_engagement(conn=conn, events=[_event(nid, m, minute=30) for m in kept])

    batch = [
        _event(nid, "m0", minute=2),  # a replay of a counted report: no earlier first_at
        _event(nid, "x1", minute=40, source="api"),  # counted (the row keeps its first source)
        _event(nid, "x1", minute=50),  # a replay of the batch's own event
        _event(nid, None, minute=35),  # no marker: counted, and the row is full
        _event(nid, "x2", minute=59),  # capped, no later last_at
        _event(nid, "x2", minute=3),  # capped again: a capped report's marker is not kept
        _event(nid, "m1", minute=1),  # still a replay, not capped
        _event(nid, "x1", minute=1),  # still a replay
    ]
    recorded = await record_engagement(conn=conn, events=batch)

    assert _flags(recorded) == [
        ("m0", False, False), ("x1", True, False), ("x1", False, False), (None, True, False),
        ("x2", False, True), ("x2", False, True), ("m1", False, False), ("x1", False, False),
    ]  # fmt: skip
    assert await _rows(conn, nid) == [
        ("opened", "", MAX_COUNTED, [*kept, "x1"], SENT + timedelta(minutes=30),
         SENT + timedelta(minutes=40), "sendgrid"),
    ]  # fmt: skip


async def test_a_batch_folds_as_the_same_events_recorded_one_at_a_time(conn: asyncpg.Connection) -> None:
    """Random reports on a few rows of two notifications (replays, unmarked ones, past the cap,
    two batches so the second meets rows already there), recorded as batches for one copy and one
    event at a time for another: the same answers and the same rows."""
    rng = random.Random(20261130)
    markers = [f"r{i}" for i in range(MAX_COUNTED + 20)]
    # Each pair in the order a batch takes notifications in, so the two copies are answered alike.
    batched = sorted([await _notification(conn) for _ in range(2)], key=str)
    single = sorted([await _notification(conn) for _ in range(2)], key=str)

    def batch() -> list[tuple[int, EngagementType, str, str | None, int, str]]:
        return [
            (rng.randrange(2), rng.choice([EngagementType.opened, EngagementType.clicked]),
             rng.choice(["https://a.example/", "https://b.example/"]),
             None if rng.random() < 0.15 else rng.choice(markers), rng.randrange(1, 59),
             rng.choice(["sendgrid", "api"]))
            for _ in range(400)
        ]  # fmt: skip

    for spec in (batch(), batch()):

        def events(nids: list[uuid.UUID], spec: list[Any] = spec) -> list[EngagementEvent]:
            return [
                _event(nids[n], m, minute=minute, type=t, link=link if t is EngagementType.clicked else "",
                       source=source)
                for n, t, link, m, minute, source in spec
            ]  # fmt: skip

        as_batch = await record_engagement(conn=conn, events=events(batched))
        one_by_one = [
            (await record_engagement(conn=conn, events=[e]))[0] for e in as_batch_order(events(single))
        ]

        assert [(r.counted, r.capped) for r in as_batch] == [(r.counted, r.capped) for r in one_by_one]
    assert sum(r.capped for r in as_batch) > 0 and sum(not r.counted and not r.capped for r in as_batch) > 0
    for mine, theirs in zip(batched, single, strict=True):
        assert await _rows(conn, mine) == await _rows(conn, theirs)


def as_batch_order(events: list[EngagementEvent]) -> list[EngagementEvent]:
    """The order ``record_engagement`` answers a batch in (notification, type, link; stable)."""
    return sorted(events, key=lambda e: (str(e.notification_id), e.type.value, e.link))


async def test_first_events_count_once_in_the_rollups_and_each_counted_report_is_a_webhook_event(
    conn: asyncpg.Connection,
) -> None:
    await conn.execute(
        "INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, secret) VALUES (gen_random_uuid(),"
        " 't-engaged', 'https://hooks.example/', ARRAY['notification.opened', 'notification.clicked'], 's')"
    )
    fresh, clicked_before = await _notification(conn), await _notification(conn)
    await record_engagement(
        conn=conn,
        events=[_event(clicked_before, "c0", type=EngagementType.clicked, link="https://a.example/")],
    )
    before = await _rollup(conn)
    clicks = [
        _event(n, f"c{n}{link}", type=EngagementType.clicked, link=link)
        for n in (fresh, clicked_before)
        for link in ("https://b.example/", "https://c.example/")
    ]
    opens = [_event(fresh, m) for m in ("o1", "o2", "o1")]

    recorded = await record_engagement(conn=conn, events=clicks + opens)

    assert sum(r.counted for r in recorded) == 6
    after = await _rollup(conn)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)  # the fresh notification's open and click
    events = await conn.fetch(
        "SELECT type, count(*) AS n FROM webhook_events WHERE tenant_id = 't-engaged' GROUP BY type ORDER BY type"
    )
    assert [tuple(e) for e in events] == [("notification.clicked", 5), ("notification.opened", 2)]


async def test_only_a_tenant_with_a_webhook_endpoint_has_its_reports_made_into_webhook_events(
    conn: asyncpg.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant without an endpoint would get no event row anyway: its reports are not even built,
    encoded and sent to ``enqueue_events`` (4.5 ms of 500 opens, most of it this process's CPU)."""
    await conn.execute("INSERT INTO tenants (id, name) VALUES ('t-hooked', 't-hooked')")
    await conn.execute(
        "INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, secret) VALUES (gen_random_uuid(),"
        " 't-hooked', 'https://hooks.example/', ARRAY['notification.opened'], 's')"
    )
    quiet, hooked = await _notification(conn), await _notification(conn, tenant="t-hooked")
    passed: list[str] = []

    async def enqueue_events(conn: asyncpg.Connection, *, events: list[WebhookEventIn]) -> None:
        passed.extend(e.tenant_id for e in events)
        await webhook_events.enqueue_events(conn, events=events)

    monkeypatch.setattr(engagement, "enqueue_events", enqueue_events)
    recorded = await record_engagement(
        conn=conn, events=[_event(quiet, "q1"), _event(hooked, "h1", tenant="t-hooked"), _event(quiet, "q2")]
    )

    assert sum(r.counted for r in recorded) == 3
    assert passed == ["t-hooked"]
    logged = await conn.fetch(
        "SELECT tenant_id FROM webhook_events WHERE tenant_id IN ('t-engaged', 't-hooked')"
    )
    assert [r["tenant_id"] for r in logged] == ["t-hooked"]


async def _rollup(conn: asyncpg.Connection) -> tuple[int, int]:
    row = await conn.fetchrow(
        "SELECT coalesce(sum(opened), 0) AS opened, coalesce(sum(clicked), 0) AS clicked"
        " FROM analytics_hourly WHERE tenant_id = 't-engaged'"
    )
    return row["opened"], row["clicked"]


class _Counting:
    """An asyncpg connection that counts the statements sent through it."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn, self.statements = conn, 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.conn, name)
        if name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
            self.statements += 1
        return attribute


async def test_a_batch_is_a_few_statements_whatever_its_size(conn: asyncpg.Connection) -> None:
    """Each statement was one round trip and a row lock held longer: 25,000 opens of 1,000 emails
    held SendGrid's turn for 11.6 s (``bench.sendgrid_batch``)."""
    nids = [await _notification(conn) for _ in range(20)]
    events = [_event(n, f"{n}-{i}", minute=i + 1) for n in nids for i in range(25)]
    events += [_event(n, f"{n}-0") for n in nids]  # replays
    events += [
        _event(n, "c", type=EngagementType.clicked, link=f"https://{i}.example/") for i, n in enumerate(nids)
    ]
    counting = _Counting(conn)

    recorded = await record_engagement(conn=counting, events=events)  # type: ignore[arg-type]

    assert sum(r.counted for r in recorded) == 20 * 26
    assert counting.statements <= 5  # the claim, the rollups' keys and counts, the counts, the webhooks


async def test_the_same_batch_recorded_at_once_by_two_transactions_counts_once(database_url: str) -> None:
    """The second waits on the rows the first claimed (new rows too) and then finds its markers."""
    tenant = f"t-{secrets.token_hex(4)}"
    first, second = [await asyncpg.connect(asyncpg_dsn(database_url)) for _ in range(2)]
    try:
        await first.execute("INSERT INTO tenants (id, name) VALUES ($1, $1)", tenant)
        nid = await _notification(first, tenant)
        batch = [_event(nid, f"m{i}", tenant=tenant) for i in range(5)]
        async with first.transaction():
            mine = await record_engagement(conn=first, events=batch)
            theirs = asyncio.create_task(_recorded_in_a_transaction(second, batch))
            await wait_until(lambda: _waiting_on_a_lock(first, second), 10)
        assert [r.counted for r in mine] == [True] * 5
        assert [r.counted for r in await asyncio.wait_for(theirs, 10)] == [False] * 5
        assert await first.fetchval("SELECT count FROM engagement WHERE notification_id = $1", nid) == 5
    finally:
        await first.execute("DELETE FROM engagement WHERE tenant_id = $1", tenant)
        await first.execute("DELETE FROM notifications WHERE tenant_id = $1", tenant)
        await first.execute("DELETE FROM users WHERE tenant_id = $1", tenant)
        await first.execute("DELETE FROM tenants WHERE id = $1", tenant)
        await first.close()
        await second.close()


async def _recorded_in_a_transaction(
    conn: asyncpg.Connection, batch: list[EngagementEvent]
) -> list[Recorded]:
    async with conn.transaction():
        return await record_engagement(conn=conn, events=batch)


async def _waiting_on_a_lock(observer: asyncpg.Connection, waiter: asyncpg.Connection) -> bool:
    state = await observer.fetchval(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1", waiter.get_server_pid()
    )
    return bool(state == "Lock")


async def test_a_marker_of_any_text_is_kept_and_recognised(conn: asyncpg.Connection) -> None:
    """Markers travel to the row as JSON: quotes, backslashes, escapes, a NUL, a lone surrogate and
    one far past what a row keeps are each counted once and their replays recognised."""
    nid = await _notification(conn)
    hostile = ['"]}', "\\u0000\\", "a\x00b", "x\ud800y", "é" + "m" * 10_000, "[1, 2]", "null", ""]

    first = await record_engagement(conn=conn, events=[_event(nid, m) for m in hostile])
    again = await record_engagement(conn=conn, events=[_event(nid, m) for m in hostile])

    assert [r.counted for r in first] == [True] * len(hostile)  # "" is no marker: counted each time
    assert [r.counted for r in again] == [False] * (len(hostile) - 1) + [True]
    seen = await conn.fetchval("SELECT seen FROM engagement WHERE notification_id = $1", nid)
    assert len(seen) == len(hostile) - 1 and max(len(m) for m in seen) == 200
