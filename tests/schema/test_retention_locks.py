"""Partition upkeep under load: the detach holds the log only briefly, never needs the tables an
accept holds, gives up rather than queue every accept behind a long reader (a table with a default
partition) or leaves its day detach pending for the next run to finish (``CONCURRENTLY``, the
accept's tables), and a day a stopped run left detached goes on the next run; creating a day ahead
neither waits for nor blocks a send (docs/partitioning.md, "Retention under load")."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator

import asyncpg
import pytest

from clarion.log_maintenance import maintain
from clarion.pg import asyncpg_dsn
from harness.services import drop_database, fresh_database, wait_until
from schema import partition_drops, partitions

OLD = dt.date(2001, 2, 3)
LATER = OLD + dt.timedelta(days=40)


@pytest.fixture
async def dsn() -> AsyncIterator[str]:
    url = await fresh_database("clarion_retention")
    try:
        yield asyncpg_dsn(url)
    finally:
        await drop_database(url)


@pytest.fixture
async def conns(dsn: str) -> AsyncIterator[tuple[asyncpg.Connection, asyncpg.Connection]]:
    """Two sessions on the database: the upkeep's, and another's (an accept, a reader)."""
    upkeep, other = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        yield upkeep, other
    finally:
        await upkeep.close()
        await other.close()


@pytest.fixture
def impatient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tries, no pause between them: giving up takes a moment, not five seconds."""
    monkeypatch.setattr(partitions, "LOCK_TRIES", 2)
    monkeypatch.setattr(partitions, "LOCK_PAUSE_S", 0.0)


async def _old_day(conn: asyncpg.Connection) -> None:
    """A sent notification, with engagement, on ``OLD``'s own partitions; ``LATER``'s days made."""
    await maintain(conn=conn, today=OLD, retention_days=30, partitions_ahead=0)
    await maintain(conn=conn, today=LATER, retention_days=1_000, partitions_ahead=0)
    await conn.execute("INSERT INTO tenants (id, name) VALUES ('t', 't')")
    user = await conn.fetchval(
        "INSERT INTO users (id, tenant_id, external_id) VALUES (gen_random_uuid(), 't', 'u') RETURNING id"
    )
    at = dt.datetime(OLD.year, OLD.month, OLD.day, 12, tzinfo=dt.UTC)
    nid = await conn.fetchval(
        "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, data, status,"
        " created_at) VALUES (gen_random_uuid(), 't', 'e', 'x', $1, 'push', '{}', 'sent', $2) RETURNING id",
        user,
        at,
    )
    await conn.execute(
        "INSERT INTO engagement (notification_id, type, tenant_id, notification_created_at, first_at, last_at,"
        " source) VALUES ($1, 'opened', 't', $2, $2, $2, 'api')",
        nid,
        at,
    )


async def test_a_day_drops_while_an_accept_holds_users(
    conns: tuple[asyncpg.Connection, asyncpg.Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitions, "LOCK_TRIES", 1)  # one try: waiting for users would fail it
    upkeep, accept = conns
    await _old_day(upkeep)
    async with accept.transaction():  # an accept between its user upsert and its insert
        await accept.execute(
            "INSERT INTO users (id, tenant_id, external_id) VALUES (gen_random_uuid(), 't', 'v')"
        )
        report = await maintain(conn=upkeep, today=LATER, retention_days=30, partitions_ahead=0)
        await accept.execute(
            "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, data)"
            " SELECT gen_random_uuid(), 't', 'e2', 'x', id, 'push', '{}' FROM users WHERE external_id = 'v'"
        )
    day = f"p{OLD:%Y%m%d}"
    assert {f"engagement_{day}", f"notifications_{day}"} <= set(report.dropped)


async def test_a_day_is_detached_concurrently_beside_an_open_accept(dsn: str) -> None:
    upkeep, accept, later = [await asyncpg.connect(dsn) for _ in range(3)]
    try:
        await _old_day(upkeep)
        day = partitions.partition_name("notifications", OLD)
        now = dt.datetime(LATER.year, LATER.month, LATER.day, 9, tzinfo=dt.UTC)
        send = (
            "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, data,"
            " created_at) SELECT gen_random_uuid(), 't', $1, 'x', id, 'push', '{}', $2 FROM users"
        )
        async with accept.transaction():  # an accept in flight: ROW EXCLUSIVE on the log
            await accept.execute(send, "in flight", now)
            upkeep_run = asyncio.create_task(
                maintain(conn=upkeep, today=LATER, retention_days=30, partitions_ahead=0)
            )
            # The detach's first step is not blocked by the open accept (ACCESS EXCLUSIVE would
            # wait for it, and never get here): the day is detach pending while the accept is open.
            pending = "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = to_regclass($1)"
            await wait_until(lambda: later.fetchval(pending, day), timeout_s=5, interval_s=0.01)
            # Nor does the detach block sends: a new one goes in at once, and the open one carries on.
            await later.execute("SET lock_timeout = 100")
            await later.execute(send, "sent during the detach", now)
            await accept.execute(send, "in flight, second row", now)
            assert not upkeep_run.done()  # its second step waits for the accept in flight...
        report = await asyncio.wait_for(upkeep_run, 10)  # ...and ends once it has committed
        assert {day, partitions.partition_name("engagement", OLD)} <= set(report.dropped)
        assert await later.fetchval("SELECT count(*) FROM notifications") == 3
    finally:
        for conn in (upkeep, accept, later):
            await conn.close()


async def test_the_detach_gives_up_behind_a_long_reader_and_keeps_the_day(
    conns: tuple[asyncpg.Connection, asyncpg.Connection], impatient: None
) -> None:
    upkeep, reader = conns
    await _old_day(upkeep)
    await upkeep.execute(
        "INSERT INTO delivery_attempts (notification_id, attempt, provider, started_at, finished_at, outcome)"
        " SELECT id, 1, 'sandbox', created_at, created_at, 'sent' FROM notifications"
    )
    async with reader.transaction():  # a search still reading the attempts (a table with a default)
        await reader.fetchval("SELECT count(*) FROM delivery_attempts")
        with pytest.raises(asyncpg.LockNotAvailableError):
            await maintain(conn=upkeep, today=LATER, retention_days=30, partitions_ahead=0)
    assert OLD in await partitions.existing_days(upkeep, parent="delivery_attempts")
    assert await upkeep.fetchval("SELECT count(*) FROM delivery_attempts") == 1
    report = await maintain(conn=upkeep, today=LATER, retention_days=30, partitions_ahead=0)
    assert partitions.partition_name("delivery_attempts", OLD) in report.dropped


async def test_a_detach_left_pending_behind_a_long_reader_is_finished_by_the_next_run(
    conns: tuple[asyncpg.Connection, asyncpg.Connection], impatient: None
) -> None:
    upkeep, reader = conns
    await _old_day(upkeep)
    day = partitions.partition_name("notifications", OLD)
    async with reader.transaction():  # a search still reading the log: the detach waits for it
        await reader.fetchval("SELECT count(*) FROM notifications")
        with pytest.raises(asyncpg.LockNotAvailableError):
            await maintain(conn=upkeep, today=LATER, retention_days=30, partitions_ahead=0)
        # Its first step committed: the day is detach pending, and no new query sees it; its
        # engagement, which goes only after it, is all there.
        assert await partition_drops.pending_detaches(upkeep, parent="notifications") == [day]
        assert await upkeep.fetchval("SELECT count(*) FROM notifications") == 0
        assert OLD in await partitions.existing_days(upkeep, parent="engagement")
        assert await upkeep.fetchval("SELECT count(*) FROM engagement") == 1
    report = await maintain(conn=upkeep, today=LATER, retention_days=30, partitions_ahead=0)
    assert {day, partitions.partition_name("engagement", OLD)} <= set(report.dropped)
    assert await partition_drops.pending_detaches(upkeep, parent="notifications") == []
    assert await upkeep.fetchval("SELECT to_regclass($1)", day) is None


async def test_the_next_run_finishes_a_detach_interrupted_in_its_pending_state(dsn: str) -> None:
    upkeep, reader = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        await _old_day(upkeep)
        day = partitions.partition_name("notifications", OLD)
        async with reader.transaction():  # the detach's second step waits for this reader
            await reader.fetchval("SELECT count(*) FROM notifications")
            await upkeep.execute("SET statement_timeout = 300")  # the upkeep stopped half-way
            with pytest.raises(asyncpg.QueryCanceledError):
                await upkeep.execute(f"ALTER TABLE notifications DETACH PARTITION {day} CONCURRENTLY")
            await upkeep.execute("RESET statement_timeout")
        assert await partition_drops.pending_detaches(upkeep, parent="notifications") == [day]
        report = await maintain(conn=upkeep, today=LATER, retention_days=30, partitions_ahead=0)
        assert day in report.dropped
        assert await upkeep.fetchval("SELECT to_regclass($1)", day) is None
        assert partitions.partition_name("engagement", OLD) in report.dropped
    finally:
        await upkeep.close()
        await reader.close()


async def test_a_day_left_detached_goes_on_the_next_run(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await maintain(conn=conn, today=OLD, retention_days=30, partitions_ahead=0)
        left = [partitions.partition_name(parent, OLD) for parent in ("delivery_attempts", "engagement")]
        for name in left:  # detached, then the run stopped
            await conn.execute(f"ALTER TABLE {name.rsplit('_p', 1)[0]} DETACH PARTITION {name}")
        report = await maintain(conn=conn, today=LATER, retention_days=30, partitions_ahead=0)
        for name in left:  # engagement's days go with the log's: its leftovers too
            assert name in report.dropped
            assert await conn.fetchval("SELECT to_regclass($1)", name) is None
    finally:
        await conn.close()


async def test_creating_a_day_gives_up_behind_a_long_reader_of_a_table_with_a_default(
    conns: tuple[asyncpg.Connection, asyncpg.Connection], impatient: None
) -> None:
    upkeep, reader = conns
    async with reader.transaction():  # it reads the default partition, which the attach locks
        await reader.fetchval("SELECT count(*) FROM engagement")
        with pytest.raises(asyncpg.LockNotAvailableError):
            await partitions.ensure_ahead(upkeep, parent="engagement", today=OLD, days_ahead=0)
        # Without a default partition, nothing a reader holds is in the way.
        await reader.fetchval("SELECT count(*) FROM notifications")
        assert await partitions.ensure_ahead(
            upkeep, parent="notifications", today=OLD, days_ahead=0, default_partition=False
        ) == [partitions.partition_name("notifications", OLD)]
    assert await partitions.ensure_ahead(upkeep, parent="engagement", today=OLD, days_ahead=0) == [
        partitions.partition_name("engagement", OLD)
    ]


async def test_creating_a_day_neither_waits_for_nor_blocks_a_send(
    conns: tuple[asyncpg.Connection, asyncpg.Connection], impatient: None
) -> None:
    upkeep, accept = conns
    await _old_day(upkeep)  # OLD's day and LATER's exist
    at = dt.datetime(OLD.year, OLD.month, OLD.day, 13, tzinfo=dt.UTC)
    send = (
        "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, data, created_at)"
        " SELECT gen_random_uuid(), 't', $1, 'x', id, 'push', '{}', $2 FROM users WHERE external_id = 'u'"
    )
    tomorrow = OLD + dt.timedelta(days=1)
    async with accept.transaction():  # a send in its transaction, and a read of its day
        await accept.execute(send, "during", at)
        await accept.fetchval("SELECT count(*) FROM notifications WHERE created_at BETWEEN $1 AND $1", at)
        # ACCESS EXCLUSIVE on notifications (CREATE TABLE ... PARTITION OF) would wait for this
        # transaction and give up: two tries of LOCK_TIMEOUT_MS.
        assert await partitions.ensure_ahead(
            upkeep, parent="notifications", today=tomorrow, days_ahead=0, default_partition=False
        ) == [partitions.partition_name("notifications", tomorrow)]
    after = tomorrow + dt.timedelta(days=1)
    async with upkeep.transaction():  # and the other way round: a day attached, not yet committed
        assert await partitions.ensure_ahead(
            upkeep, parent="notifications", today=tomorrow, days_ahead=1, default_partition=False
        ) == [partitions.partition_name("notifications", after)]
        await accept.execute("SET lock_timeout = 500")
        await accept.execute(send, "while attaching", at)  # LockNotAvailableError if blocked
    assert await accept.fetchval("SELECT count(*) FROM notifications WHERE event_id LIKE 'while%'") == 1
