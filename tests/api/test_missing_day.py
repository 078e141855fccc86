"""A send whose day of the log has no partition (the upkeep has not run for a week) is accepted all
the same: the API creates the day on demand (clarion.missing_days), counts and logs it, and the
send lands in its new day. The safety net the default partition used to be (migration 0016)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import httpx
import pytest

from clarion.broker import TansuBroker
from clarion.log_maintenance import KEY_SPAN_DAYS
from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from harness.services import ApiServer, api_client, drop_database, fresh_database
from harness.tenants import TenantInfo, make_tenant
from schema import partitions
from schema.db import create_engine
from schema.partition_ranges import span_start
from schema.partitions import existing_ranges, partition_name
from tests.conftest import METRICS_TOKEN, TEST_REDIS_PREFIX
from tests.fixtures.answers import scrape
from tests.fixtures.sends import email_send

ON_DEMAND = "clarion_log_partitions_created_on_demand_total"


async def on_demand(scraper: httpx.AsyncClient) -> float:
    text = (await scraper.get("/metrics")).text
    return sum(scrape(text, ON_DEMAND, table=t) for t in ("notifications", "notification_keys"))


async def without_today(conn: asyncpg.Connection) -> dt.date:
    """Today's partitions of the accept's tables dropped, as if the upkeep had stopped long ago."""
    today = dt.datetime.now(dt.UTC).date()
    gone = [partition_name("notifications", today)]
    gone += [
        name for name, days in await existing_ranges(conn, parent="notification_keys") if days.covers(today)
    ]
    for name in gone:
        await conn.execute(f"ALTER TABLE {name.rsplit('_p', 1)[0]} DETACH PARTITION {name}")
        await conn.execute(f"DROP TABLE {name}")
    return today


@pytest.fixture
async def own_database() -> AsyncIterator[str]:
    url = await fresh_database("clarion_missing_day")  # migrated to head: today .. today + 7
    try:
        yield url
    finally:
        await drop_database(url)


@dataclass(frozen=True)
class Missing:
    """The API on a database whose accept tables have no partition for today (``without_today``)."""

    api: ApiServer
    tenant: TenantInfo
    conn: asyncpg.Connection
    today: dt.date


@pytest.fixture
async def missing(own_database: str, kafka: TansuBroker) -> AsyncIterator[Missing]:
    engine = create_engine(own_database, pool_size=2)
    tenant = await make_tenant(engine)
    await engine.dispose()
    conn = await asyncpg.connect(asyncpg_dsn(own_database))
    settings = Settings(
        env="test", redis_key_prefix=TEST_REDIS_PREFIX, database_url=own_database,
        kafka_bootstrap=kafka.bootstrap, db_pool_size=2, metrics_token=METRICS_TOKEN,
    )  # fmt: skip
    api = ApiServer(settings)
    await api.start()
    try:
        yield Missing(api, tenant, conn, await without_today(conn))
    finally:
        await api.stop()
        await conn.close()


async def test_a_send_whose_day_is_missing_is_accepted_into_a_day_made_for_it(missing: Missing) -> None:
    api, tenant, conn, today = missing.api, missing.tenant, missing.conn, missing.today
    refused = "INSERT INTO notification_keys VALUES ('t', 'e', $1, gen_random_uuid(), 'h')"
    with pytest.raises(asyncpg.CheckViolationError, match="no partition of relation"):
        await conn.execute(refused, today)  # what the accept meets

    async with api_client(api.url, tenant.key) as client, api_client(api.url, METRICS_TOKEN) as scraper:
        before = await on_demand(scraper)
        accepted = await client.post("/v1/notifications", json=email_send())
        assert accepted.status_code == 202, accepted.text
        nid = accepted.json()["id"]
        shown = await client.get(f"/v1/notifications/{nid}")
        assert shown.status_code == 200, shown.text
        assert await on_demand(scraper) == before + 1  # one refusal, its day made once
    part = await conn.fetchval("SELECT tableoid::regclass::text FROM notifications WHERE id = $1", nid)
    assert part == partition_name("notifications", today)
    key_part = await conn.fetchval(
        "SELECT tableoid::regclass::text FROM notification_keys WHERE notification_id = $1", nid
    )
    week = [
        days for name, days in await existing_ranges(conn, parent="notification_keys") if name == key_part
    ]
    assert week and week[0].covers(today) and week[0].start >= span_start(today, KEY_SPAN_DAYS)
    for parent in ("notifications", "notification_keys"):  # and still no default partition
        assert await conn.fetchval("SELECT to_regclass($1)", f"{parent}_default") is None


async def test_a_missing_day_that_cannot_be_made_now_is_a_503_to_retry_then_accepted(
    missing: Missing, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(partitions, "LOCK_TRIES", 1)  # one 200 ms try, not ten
    api, tenant, conn = missing.api, missing.tenant, missing.conn
    async with api_client(api.url, tenant.key) as client:
        async with conn.transaction():  # the parent held as an upkeep creating a day holds it
            await conn.execute("LOCK TABLE notifications IN SHARE UPDATE EXCLUSIVE MODE")
            held = await client.post("/v1/notifications", json=email_send())
        assert held.status_code == 503, held.text
        assert held.json()["error"]["code"] == "database_unavailable"
        assert held.headers["retry-after"] == "2"
        again = await client.post("/v1/notifications", json=email_send())
        assert again.status_code == 202, again.text
