"""The API's outbox marks a published row only while no worker has taken it, and only after a
delay: a claimed row gets no new version from the mark (the claim stamped ``queued_at``), a row
still waiting is marked and shown as ``queued``, and stopping the API marks what the broker
acknowledged without waiting out the delay.

The rows are scheduled sends two hours out (the API publishes none of them and no worker or relay
touches them), changed inside the test's own transaction where the session's processes could.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast
from uuid import UUID

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.outbox import MARK_WAITING, Outbox
from clarion.kafka import Publisher
from clarion.pg import create_pool
from clarion.settings import Settings
from schema.enums import Channel, Priority
from schema.ids import created_window
from schema.messages import NotificationMessage
from tests.fixtures.sends import scheduled_email

AS_ACCEPTED = sa.text(
    "UPDATE notifications SET status = 'accepted', send_at = NULL, not_before = NULL WHERE id = :id"
)
AS_CLAIMED = sa.text(  # what CLAIM leaves on a row the outbox had not marked yet
    "UPDATE notifications SET status = 'sending', send_at = NULL, not_before = NULL, queued_at = now(),"
    " lease_until = now() + interval '30 seconds' WHERE id = :id"
)
ROW = sa.text(
    "SELECT ctid::text AS version, status, queued_at, published_at FROM notifications WHERE id = :id"
)


async def test_the_mark_writes_no_version_of_a_row_a_worker_claimed(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    claimed, waiting = await scheduled_email(client), await scheduled_email(client)
    ids = [UUID(claimed), UUID(waiting)]
    async with engine.connect() as conn:
        transaction = await conn.begin()
        try:  # rolled back: the session's relay and workers never see these rows as due
            await conn.execute(AS_CLAIMED, {"id": claimed})
            await conn.execute(AS_ACCEPTED, {"id": waiting})
            before = {nid: (await conn.execute(ROW, {"id": nid})).one() for nid in (claimed, waiting)}
            await conn.exec_driver_sql(MARK_WAITING, (ids, *created_window(ids)))
            after = {nid: (await conn.execute(ROW, {"id": nid})).one() for nid in (claimed, waiting)}
        finally:
            await transaction.rollback()
    assert after[claimed] == before[claimed]  # same version: not rewritten
    assert after[claimed].published_at is None
    assert after[waiting].version != before[waiting].version
    assert after[waiting].status == "accepted"
    assert after[waiting].queued_at is not None and after[waiting].published_at is not None


class _Acks:
    """A broker that acknowledges every message, and says when it was asked."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()

    async def publish_many(self, messages: Sequence[NotificationMessage]) -> list[str]:
        self.asked.set()
        return [str(m.id) for m in messages]


async def test_stopping_the_outbox_marks_what_the_broker_acked_without_waiting(
    client: httpx.AsyncClient, engine: AsyncEngine, settings: Settings
) -> None:
    nid = await scheduled_email(client)
    async with engine.begin() as conn:
        row: Any = (
            await conn.execute(
                sa.text("SELECT tenant_id, user_id, channel, priority FROM notifications WHERE id = :id"),
                {"id": nid},
            )
        ).one()
    message = NotificationMessage(
        id=UUID(nid), tenant_id=row.tenant_id, channel=Channel(row.channel), user_id=row.user_id,
        priority=Priority(row.priority),
    )  # fmt: skip
    broker = _Acks()
    pool = await create_pool(settings.database_url, size=1)
    try:
        outbox = Outbox(pool, cast(Publisher, broker), mark_after_s=3600)
        await outbox.start()
        assert outbox.submit(message)
        await asyncio.wait_for(broker.asked.wait(), 10)
        acked = await pool.fetchrow(
            "SELECT published_at, queued_at FROM notifications WHERE id = $1", UUID(nid)
        )
        await asyncio.wait_for(outbox.stop(), 10)
        stopped = await pool.fetchrow("SELECT published_at FROM notifications WHERE id = $1", UUID(nid))
    finally:
        await pool.close()
    assert acked["published_at"] is None and acked["queued_at"] is None  # an hour before its mark
    assert stopped["published_at"] is not None  # a scheduled row: marked published, not queued
