"""The ``accepted`` rollups written once a second: every count lands, none twice, a failed write is
kept for the next one (within a bound), and stopping writes what is left."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import AsyncIterator

import asyncpg
import pytest

from api import accepted_counts
from api.accepted_counts import AcceptedCounts
from clarion.pg import create_pool
from core.analytics import RollupKey, hour_of
from harness.services import wait_until

HOUR = hour_of(dt.datetime.now(dt.UTC))


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, size=2)
    try:
        yield pool
    finally:
        await pool.close()


def key(tenant: str, template: str = "welcome", hour: dt.datetime = HOUR) -> RollupKey:
    return RollupKey(tenant_id=tenant, hour=hour, channel="email", template=template, template_version=1)


async def accepted(pool: asyncpg.Pool, tenant: str) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT template, accepted FROM analytics_hourly WHERE tenant_id = $1 AND hour = $2", tenant, HOUR
    )
    return {r["template"]: r["accepted"] for r in rows}


async def test_counts_added_between_writes_land_once_each(pool: asyncpg.Pool) -> None:
    tenant = f"ac-{secrets.token_hex(3)}"
    counts = AcceptedCounts(pool=pool, interval_s=3600)  # written only when told
    counts.add([key(tenant)] * 3 + [key(tenant, "reset")])
    counts.add([key(tenant)])
    assert counts.pending == 5 and await accepted(pool, tenant) == {}
    await counts.flush()
    assert await accepted(pool, tenant) == {"welcome": 4, "reset": 1}
    await counts.flush()  # nothing new: nothing added twice
    counts.add([key(tenant, "reset")])
    await counts.aclose()  # stopping writes what is left
    assert await accepted(pool, tenant) == {"welcome": 4, "reset": 2} and counts.pending == 0


async def test_the_timer_writes_without_being_asked(pool: asyncpg.Pool) -> None:
    tenant = f"ac-{secrets.token_hex(3)}"
    counts = AcceptedCounts(pool=pool, interval_s=0.05)
    counts.start()
    try:
        counts.add([key(tenant)] * 2)

        async def written() -> bool:
            return await accepted(pool, tenant) == {"welcome": 2}

        await wait_until(written, 10)
    finally:
        await counts.aclose()


async def test_a_failed_write_is_kept_for_the_next_and_bounded(
    pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = f"ac-{secrets.token_hex(3)}"
    counts = AcceptedCounts(pool=pool, interval_s=3600)
    await pool.close()  # the database is out of reach: the write fails
    counts.add([key(tenant)] * 2)
    await counts.flush()
    assert counts.pending == 2
    monkeypatch.setattr(accepted_counts, "MAX_KEYS", 3)
    older = dt.timedelta(hours=1)
    counts.add([key(tenant, f"t{i}", HOUR - i * older) for i in range(1, 4)])
    await counts.flush()
    # Four rows held, three allowed: the oldest hour's goes.
    assert counts.pending == 4
    assert key(tenant, "t3", HOUR - 3 * older) not in counts._pending
