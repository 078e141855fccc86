"""``workers.claim.claim`` against the real log: which rows a worker may take, and that it takes
each only once (the send-side dedupe every redelivered Kafka message relies on).

The rows are scheduled sends two hours out (no relay or worker of the session touches them),
shaped and claimed inside one transaction that is rolled back, so nothing else ever sees the
claimable states this file makes. Inside it ``now()`` is one instant, so a lease is exact.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID

import asyncpg
import httpx
import pytest

from schema.enums import TERMINAL_STATUSES
from schema.ids import uuid7
from tests.fixtures.sends import email_send
from workers.claim import Unreadable, claim

LEASE_S = 30.0
PAST, FUTURE = "now() - interval '1 second'", "now() + interval '1 hour'"
# What each claimable state looks like in the log (every column the claim reads, set explicitly).
CLAIMABLE = {
    "accepted": "status = 'accepted', not_before = NULL, queued_at = NULL",
    "accepted, queued_at set (shown as queued)": "status = 'accepted', not_before = NULL, queued_at = now()",
    "queued, as written before migration 0010": "status = 'queued', not_before = NULL",
    "retrying, due": f"status = 'retrying', not_before = {PAST}",
    "delayed, due": f"status = 'delayed', not_before = {PAST}",
    "scheduled, due": f"status = 'scheduled', not_before = {PAST}",
    "sending, lease expired": f"status = 'sending', lease_until = {PAST}, claims = 1",
}
NOT_CLAIMABLE = {
    "retrying, not yet due": f"status = 'retrying', not_before = {FUTURE}",
    "delayed, not yet due": f"status = 'delayed', not_before = {FUTURE}",
    "scheduled, as the API stored it two hours out": "status = 'scheduled'",
    "sending, leased": f"status = 'sending', lease_until = {FUTURE}, claims = 1",
    **{
        f"{s.value} (terminal)": f"status = '{s.value}', not_before = NULL" for s in sorted(TERMINAL_STATUSES)
    },
}


@pytest.fixture
async def conn(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
    async with pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        try:
            yield connection
        finally:
            await transaction.rollback()


async def scheduled(client: httpx.AsyncClient) -> UUID:
    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    response = await client.post("/v1/notifications", json=email_send(send_at=later))
    assert response.status_code == 202, response.text
    return UUID(response.json()["id"])


async def shaped(client: httpx.AsyncClient, conn: asyncpg.Connection, assignments: str) -> UUID:
    """A new notification, then ``UPDATE ... SET <assignments>`` in the test's transaction."""
    nid = await scheduled(client)
    await conn.execute(f"UPDATE notifications SET {assignments} WHERE id = $1", nid)
    return nid


async def claimed_by(conn: asyncpg.Connection, ids: list[UUID]) -> tuple[list[UUID], list[Unreadable]]:
    # claim() only calls pool.fetch, which a connection has too: on this one, it runs in the
    # test's transaction.
    rows, unreadable = await claim(pool=cast(asyncpg.Pool, conn), ids=ids, lease_s=LEASE_S)
    return [r.id for r in rows], unreadable


async def row(conn: asyncpg.Connection, nid: UUID) -> dict[str, Any]:
    record = await conn.fetchrow(
        "SELECT status, claims, lease_until, lease_until - now() AS lease, history -> -1 ->> 'status' AS last,"
        " queued_at"
        " FROM notifications WHERE id = $1",
        nid,
    )
    assert record is not None
    return dict(record)


@pytest.mark.parametrize("state", list(CLAIMABLE))
async def test_a_claimable_row_is_claimed_once_with_a_lease(
    client: httpx.AsyncClient, conn: asyncpg.Connection, state: str
) -> None:
    nid = await shaped(client, conn, CLAIMABLE[state])
    claims_before = (await row(conn, nid))["claims"]

    assert await claimed_by(conn, [nid]) == ([nid], [])

    after = await row(conn, nid)
    assert after["status"] == "sending" and after["last"] == "sending"
    assert after["lease"] == timedelta(seconds=LEASE_S)
    assert after["claims"] == claims_before + 1
    assert await claimed_by(conn, [nid]) == ([], [])  # a redelivered message: nothing to send
    assert await row(conn, nid) == after


async def test_a_claim_of_a_row_the_outbox_has_not_marked_stamps_it_queued(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """The outbox skips rows a worker holds (api/outbox.py); a worker took the message from the
    broker, so the claim records the ``queued`` the mark would have."""
    nid = await shaped(
        client, conn, "status = 'accepted', send_at = NULL, not_before = NULL, queued_at = NULL"
    )
    assert (await claimed_by(conn, [nid]))[0] == [nid]
    stamped = await row(conn, nid)
    assert stamped["status"] == "sending" and stamped["queued_at"] is not None


@pytest.mark.parametrize("state", list(NOT_CLAIMABLE))
async def test_a_row_that_is_done_leased_or_not_due_is_left_alone(
    client: httpx.AsyncClient, conn: asyncpg.Connection, state: str
) -> None:
    nid = await shaped(client, conn, NOT_CLAIMABLE[state])
    before = await row(conn, nid)

    assert await claimed_by(conn, [nid]) == ([], [])
    assert await row(conn, nid) == before


async def test_a_batch_claims_what_it_may_and_a_repeated_id_once(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    due = await shaped(client, conn, CLAIMABLE["accepted"])
    leased = await shaped(client, conn, NOT_CLAIMABLE["sending, leased"])
    sent = await shaped(client, conn, "status = 'sent'")
    unknown = uuid7()

    claimed, unreadable = await claimed_by(conn, [due, leased, due, sent, unknown, due])

    assert (claimed, unreadable) == ([due], [])
    assert (await row(conn, due))["claims"] == 1


async def test_every_claim_after_a_lease_expires_is_counted_and_the_count_saturates(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    """What ``CLARION_MAX_CLAIMS`` is checked against (the pipeline, not the claim, ends the
    notification ``dead``: tests/workers/test_isolation.py)."""
    nid = await shaped(client, conn, CLAIMABLE["accepted"])
    for expected in (1, 2, 3):
        assert await claimed_by(conn, [nid]) == ([nid], [])
        assert (await row(conn, nid))["claims"] == expected
        await conn.execute(f"UPDATE notifications SET lease_until = {PAST} WHERE id = $1", nid)
    await conn.execute("UPDATE notifications SET claims = 32767 WHERE id = $1", nid)  # smallint's top
    assert await claimed_by(conn, [nid]) == ([nid], [])
    assert (await row(conn, nid))["claims"] == 32767


async def test_a_claimed_row_that_cannot_be_read_is_reported_alone_not_raised(
    client: httpx.AsyncClient, conn: asyncpg.Connection
) -> None:
    broken = await shaped(client, conn, CLAIMABLE["accepted"] + """, content = '{"subject": "no body"}'""")
    fine = await shaped(client, conn, CLAIMABLE["accepted"])
    event_id = await conn.fetchval("SELECT event_id FROM notifications WHERE id = $1", broken)

    claimed, unreadable = await claimed_by(conn, [broken, fine])

    assert claimed == [fine]
    assert unreadable == [Unreadable(broken, event_id, 0, "KeyError")]
    assert (await row(conn, broken))["status"] == "sending"  # leased: the pipeline records its failure
    assert await claimed_by(conn, [broken]) == ([], [])
