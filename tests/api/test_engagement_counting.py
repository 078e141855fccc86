"""How engagement is counted and kept: once under concurrent reports, in the metric by channel and
type, with a bounded set of replay markers, and deleted with its notification."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from core.engagement import MAX_COUNTED
from harness.services import ApiServer, api_client
from tests.conftest import METRICS_TOKEN, TenantInfo
from tests.fixtures.answers import scrape
from tests.fixtures.engagement import events_url, rows
from tests.fixtures.hooks import sent_notification


async def test_a_report_for_a_notification_no_longer_in_the_log_is_404_and_stores_nothing(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    async with engine.begin() as conn:  # as retention would, with its whole day
        await conn.execute(sa.text("DELETE FROM notifications WHERE id = :n"), {"n": nid})
    response = await client.post(events_url(nid), json={"type": "opened"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert await rows(engine, nid) == []


async def test_counted_events_are_in_the_metric_by_channel_and_type(
    api: ApiServer, client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    async with api_client(api.url, METRICS_TOKEN) as scraper:
        before = scrape(
            (await scraper.get("/metrics")).text,
            "clarion_engagement_events_total",
            channel="push",
            type="opened",
        )
        nid, _ = await sent_notification(engine, tenant, channel="push")
        await client.post(events_url(nid), json={"type": "opened"})
        await client.post(events_url(nid), json={"type": "opened"})  # a repeat: not counted
        after = scrape(
            (await scraper.get("/metrics")).text,
            "clarion_engagement_events_total",
            channel="push",
            type="opened",
        )
    assert after - before == 1


async def test_the_same_report_sent_concurrently_is_counted_once(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    answers = await asyncio.gather(
        *(client.post(events_url(nid), json={"type": "opened"}) for _ in range(10))
    )
    assert [a.status_code for a in answers] == [200] * 10
    assert sum(not a.json()["duplicate"] for a in answers) == 1
    assert await rows(engine, nid) == [("opened", "", 1)]


async def test_a_row_counts_at_most_max_counted_reports_and_recognises_every_one_it_counted(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="push")
    async with engine.begin() as conn:  # sent an hour ago, so 80 distinct times fit after it
        await conn.execute(
            sa.text("UPDATE notifications SET created_at = now() - interval '1 hour' WHERE id = :n"),
            {"n": nid},
        )
    start = datetime.now(UTC) - timedelta(minutes=30)
    times = [(start + timedelta(seconds=i)).isoformat() for i in range(MAX_COUNTED + 16)]
    answers = [await client.post(events_url(nid), json={"type": "opened", "occurred_at": at}) for at in times]
    assert [a.status_code for a in answers] == [200] * MAX_COUNTED + [422] * 16
    assert {a.json()["error"]["code"] for a in answers[MAX_COUNTED:]} == {"too_many_reports"}
    async with engine.connect() as conn:
        count, kept = (
            await conn.execute(
                sa.text("SELECT count, cardinality(seen) FROM engagement WHERE notification_id = :n"),
                {"n": nid},
            )
        ).one()
    assert (count, kept) == (MAX_COUNTED, MAX_COUNTED)
    # A replay of the first report after all the others is still a replay (it counted again before
    # 2026-11-28: the row kept only its last 64 markers), and so is the last counted one.
    for at in (times[0], times[MAX_COUNTED - 1]):
        again = await client.post(events_url(nid), json={"type": "opened", "occurred_at": at})
        assert (again.status_code, again.json()["duplicate"], again.json()["count"]) == (
            200,
            True,
            MAX_COUNTED,
        )
