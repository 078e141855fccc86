"""Shared fixtures: real PostgreSQL (a fresh migrated database per session), a real Tansu broker,
the API under uvicorn, a worker per channel and the relay, all in this process; tenants per test."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from api.relay import Relay
from clarion.broker import TansuBroker
from clarion.kafka import Publisher, create_topics
from clarion.log_maintenance import maintain
from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from harness.services import ApiServer, api_client, drop_database, fresh_database
from harness.tenants import TenantInfo, make_tenant
from schema.db import create_engine
from schema.enums import Channel
from schema.partitions import ensure_ahead
from tests.fixtures.webhooks import local, local_api  # noqa: F401 - fixtures, shared by the webhook tests
from workers.app import Worker
from workers.webhook_retention import PARENTS as WEBHOOK_TABLES


@pytest.fixture(scope="session")
async def database_url() -> AsyncIterator[str]:
    """The session's database, its log reaching back to yesterday as an install running since
    then would: tests date rows up to an hour back, which after midnight is yesterday (a run
    started at 00:24 found them in the default partition). Its webhook tables too, as ``clarion
    webhooks`` running since then keeps them: with only their defaults (migration 0008), every
    test's deliveries went there until a test's sender made the day and moved them, under the
    writers of that moment."""
    url = await fresh_database()
    yesterday = datetime.now(UTC).date() - timedelta(days=1)
    conn = await asyncpg.connect(asyncpg_dsn(url))
    try:
        await maintain(conn=conn, today=yesterday, retention_days=30, partitions_ahead=8)
        for parent in WEBHOOK_TABLES:
            await ensure_ahead(conn, parent=parent, today=yesterday, days_ahead=8)
    finally:
        await conn.close()
    yield url
    await drop_database(url)


@pytest.fixture(scope="session")
def kafka() -> Any:
    broker = TansuBroker()
    broker.start()
    yield broker
    broker.stop()


METRICS_TOKEN = "test-metrics-token"  # what the tests' Prometheus scraper sends for /metrics
OPERATOR_TOKEN = "test-operator-token"  # the platform operator's bearer for /v1/ops/cluster/...
# Every Redis key the test run's processes write starts with this (never a deployment's "clarion:").
TEST_REDIS_PREFIX = f"clarion-test-{secrets.token_hex(3)}:"


@pytest.fixture(scope="session")
async def settings(database_url: str, kafka: TansuBroker) -> Settings:
    await create_topics(kafka.bootstrap, partitions=2)
    return Settings(
        env="test",
        redis_key_prefix=TEST_REDIS_PREFIX,
        database_url=database_url,
        kafka_bootstrap=kafka.bootstrap,
        lease_s=3.0,
        relay_interval_s=0.3,
        relay_grace_s=1.0,
        relay_stale_queued_s=30.0,
        db_pool_size=8,
        metrics_token=METRICS_TOKEN,
        operator_token=OPERATOR_TOKEN,
        render_box_at_start=False,  # one child process less per test API; chaos and bench start it
    )


@pytest.fixture(scope="session")
async def engine(settings: Settings) -> AsyncIterator[AsyncEngine]:
    eng = create_engine(settings.database_url, pool_size=4)
    yield eng
    await eng.dispose()


@pytest.fixture(scope="session")
async def api(settings: Settings) -> AsyncIterator[ApiServer]:
    server = ApiServer(settings)
    await server.start()
    yield server
    await server.stop()


@dataclass
class Stack:
    api: ApiServer
    workers: dict[Channel, Worker]
    relay: Relay


@pytest.fixture(scope="session")
async def stack(settings: Settings, api: ApiServer, engine: AsyncEngine) -> AsyncIterator[Stack]:
    """API + one worker per channel + the relay: the whole of `clarion dev`, in this loop."""
    workers = {ch: Worker(settings, ch) for ch in Channel}
    await asyncio.gather(*(w.start() for w in workers.values()))
    publisher = Publisher(settings.kafka_bootstrap or "")
    async with Relay.from_settings(engine, publisher, settings).running() as relay:
        yield Stack(api, workers, relay)
    await publisher.close()
    for w in workers.values():
        await w.stop()


@pytest.fixture
async def tenant(engine: AsyncEngine) -> TenantInfo:
    """A tenant of the test's own (tests are isolated by tenant), with every scope and default templates."""
    return await make_tenant(engine)


@pytest.fixture
async def client(api: ApiServer, tenant: TenantInfo) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(api.url, tenant.key) as c:
        yield c
