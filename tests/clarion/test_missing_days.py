"""``clarion_log_partitions_created_on_demand_total`` counts the days a write's refusal created,
not the refusals: a writer that finds its day made meanwhile (by a concurrent writer or the
upkeep) creates nothing and counts nothing."""

from __future__ import annotations

import asyncpg
from prometheus_client import REGISTRY

from clarion.missing_days import MissingDay, create_missing_day
from clarion.pg import asyncpg_dsn

ON_DEMAND = "clarion_log_partitions_created_on_demand_total"


def counted(table: str) -> float:
    return REGISTRY.get_sample_value(ON_DEMAND, {"table": table}) or 0.0


async def test_a_day_made_meanwhile_is_not_counted_as_created_on_demand(database_url: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(database_url))  # the session's log has today's days
    try:
        before = counted("notifications")
        created = await create_missing_day(conn=conn, missing=MissingDay("notifications", None))
    finally:
        await conn.close()

    assert created == []
    assert counted("notifications") == before
