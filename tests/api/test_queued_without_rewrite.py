"""Reaching the broker stamps ``queued_at`` in a HOT update and leaves ``status`` alone, yet every
reader still sees ``queued``: the notification's status and history, search, the relay's rules.

The rows are scheduled sends two hours out (no worker touches them), turned into what the outbox
sees inside the test's own transaction, so the session's relay and workers never race the test.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any
from uuid import UUID

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.outbox import MARK_PUBLISHED, mark_published
from api.relay import PICK
from schema.ids import created_window
from tests.fixtures.sends import scheduled_email

AS_ACCEPTED = sa.text(
    "UPDATE notifications SET status = 'accepted', send_at = NULL, not_before = NULL,"
    " history = jsonb_build_array(jsonb_build_object('status', 'accepted', 'at', now(), 'detail', NULL))"
    " WHERE id = :id"
)
HOT_UPDATES = sa.text(
    "SELECT pg_stat_get_xact_tuples_hot_updated(tableoid), pg_stat_get_xact_tuples_updated(tableoid)"
    " FROM notifications WHERE id = :id"
)


async def _mark(conn: AsyncConnection, nid: str) -> None:
    ids = [UUID(nid)]
    await conn.exec_driver_sql(MARK_PUBLISHED, (ids, *created_window(ids)))


async def _picked(conn: AsyncConnection, *, grace_s: float, stale_s: float) -> set[str]:
    rows = await conn.exec_driver_sql(PICK, (grace_s, stale_s, 1_000_000, []))
    return {str(r.id) for r in rows}


async def test_the_broker_ack_is_a_hot_update_shown_as_queued(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    nid = await scheduled_email(client)
    async with engine.begin() as conn:
        await conn.execute(AS_ACCEPTED, {"id": nid})
        hot_before, updated_before = (await conn.execute(HOT_UPDATES, {"id": nid})).one()
        await _mark(conn, nid)
        hot_after, updated_after = (await conn.execute(HOT_UPDATES, {"id": nid})).one()
        stored = (
            await conn.execute(
                sa.text("SELECT status, queued_at FROM notifications WHERE id = :id"), {"id": nid}
            )
        ).one()
    assert (updated_after - updated_before, hot_after - hot_before) == (1, 1)  # no new index entries
    assert stored.status == "accepted" and stored.queued_at is not None
    shown = (await client.get(f"/v1/notifications/{nid}")).json()
    assert shown["status"] == "queued"
    assert [h["status"] for h in shown["history"]] == ["accepted", "queued"]
    assert datetime.fromisoformat(shown["history"][1]["at"]) == stored.queued_at


async def test_the_mark_skips_a_row_a_worker_holds_instead_of_waiting_for_it(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    """Waiting for a claim's or a record's lock made deadlocks (each a 1 s stall of both sides):
    the mark never waits, so it is never part of one."""
    held, free = await scheduled_email(client), await scheduled_email(client)
    async with engine.connect() as worker:
        await worker.execute(sa.text("SELECT 1 FROM notifications WHERE id = :id FOR UPDATE"), {"id": held})
        await asyncio.wait_for(mark_published(engine, [UUID(held), UUID(free)]), 10)
        await worker.rollback()
    async with engine.connect() as conn:
        published = dict(
            (await conn.execute(
                sa.text("SELECT id::text, published_at FROM notifications WHERE id IN (:a, :b)"),
                {"a": held, "b": free},
            )).all()
        )  # fmt: skip
    assert published[free] is not None and published[held] is None


async def test_search_tells_accepted_from_queued(client: httpx.AsyncClient, engine: AsyncEngine) -> None:
    queued, scheduled = await scheduled_email(client), await scheduled_email(client)
    async with engine.begin() as conn:
        await conn.execute(AS_ACCEPTED, {"id": queued})
        await _mark(conn, queued)

    async def found(*statuses: str) -> list[dict[str, Any]]:
        response = await client.get("/v1/notifications", params={"status": list(statuses)})
        assert response.status_code == 200, response.text
        return [{"id": i["id"], "status": i["status"]} for i in response.json()["items"]]

    assert await found("queued") == [{"id": queued, "status": "queued"}]
    assert await found("accepted") == []
    assert await found("accepted", "queued") == [{"id": queued, "status": "queued"}]
    assert await found("scheduled", "accepted") == [{"id": scheduled, "status": "scheduled"}]


async def test_the_relay_republishes_unacked_and_stale_rows_but_not_fresh_ones(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    unacked, fresh, stale, legacy = [await scheduled_email(client) for _ in range(4)]
    async with engine.connect() as conn:
        transaction = await conn.begin()
        try:  # rolled back: the session's relay never sees these rows as due
            for nid in (unacked, fresh, stale, legacy):
                await conn.execute(AS_ACCEPTED, {"id": nid})
            await _mark(conn, fresh)
            await conn.execute(
                sa.text(
                    "UPDATE notifications SET queued_at = now() - interval '1 hour',"
                    " published_at = now() - interval '1 hour' WHERE id = :id"
                ),
                {"id": stale},
            )
            await conn.execute(  # as the outbox wrote it before migration 0010
                sa.text(
                    "UPDATE notifications SET status = 'queued', published_at = now() - interval '1 hour' WHERE id = :id"
                ),
                {"id": legacy},
            )
            picked = await _picked(conn, grace_s=0, stale_s=600) & {unacked, fresh, stale, legacy}
        finally:
            await transaction.rollback()
    assert picked == {unacked, stale, legacy}
