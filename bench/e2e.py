"""End-to-end benchmark: accepts/s through POST /v1/notifications, deliveries/s to the sandbox
provider, and accept latency, with the API, an email worker and the relay as separate processes.

    .venv/bin/python -m bench.e2e [--seconds 20] [--concurrency 64] [--channel email]
    .venv/bin/python -m bench.e2e --reference --pairs 3   # `make bench`: Clarion, then the
                                                          # reference pipeline, 3 pairs, medians
    .venv/bin/python -m bench.e2e --load python --count 30000 --batch 100 --concurrency 8
    .venv/bin/python -m bench.e2e --api-workers 2            # clarion api --workers 2
    .venv/bin/python -m bench.e2e --webhook-endpoint         # the tenant has a webhook endpoint

The load comes from ``wrk`` (``bench/wrk_load.py``) for ``--seconds``, or from a Python client in
this process for ``--count`` sends (``--load python``, the only one that batches). It starts its
own Tansu broker and a fresh database (dropped afterwards). With ``--webhook-endpoint`` the bench
tenant has an endpoint, so each send also queues a webhook delivery (``bench/webhook_endpoint.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import resource
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
import asyncpg

from bench.load import Driver, LoadPlan
from bench.procfs import children_of, cpu_s, machine_busy_s, pids_named
from bench.webhook_endpoint import add_webhook_endpoint, queued_deliveries
from clarion.broker import TansuBroker
from clarion.kafka import create_topics
from clarion.pg import asyncpg_dsn
from clarion.ports import free_port
from clarion.settings import Settings
from harness.services import ClarionProcess, drop_database, fresh_database, wait_until
from harness.tenants import TenantInfo, make_tenant
from schema.db import create_engine

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


async def ready(api_url: str) -> bool:
    """``GET /readyz`` answers 200."""
    try:
        async with aiohttp.ClientSession() as s, s.get(f"{api_url}/readyz") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


@dataclass
class Measurement:
    """One run's figures: throughput and latency, and the CPU each part of the machine spent.

    ``processes`` names the pipeline's own processes; PostgreSQL (all its backends), Redis, the
    broker and this load-generating process are counted beside them, and the whole machine's busy
    time bounds it all (2 cores here: everything competes for them).
    """

    processes: dict[str, int]
    broker_pid: int | None = None
    count: int = 0
    concurrency: int = 0
    accept_s: float = 0.0
    delivered_s: float = 0.0
    p50_s: float = 0.0
    p99_s: float = 0.0
    cpu_ms: dict[str, float] = field(default_factory=dict)
    # provider accepted -> outcome recorded, p50 and p99 (s): a worker killed inside it re-sends
    # (None for the reference pipeline, which keeps no attempts)
    unrecorded_s: tuple[float, float] | None = None

    def _groups(self) -> dict[str, list[int]]:
        groups = {name: [pid] for name, pid in self.processes.items()}
        groups["postgres (all backends)"] = pids_named("postgres")
        groups["redis"] = pids_named("redis-server")
        if self.broker_pid is not None:
            groups["tansu broker"] = [self.broker_pid]
        groups["load generator (this process, wrk)"] = [os.getpid()]
        return groups

    def _cpu(self) -> dict[str, float]:
        cpu = {name: sum(cpu_s(pid) for pid in pids) for name, pids in self._groups().items()}
        # wrk, once it has exited: the children this process has waited for (the pipeline's
        # processes are still running, so they are not in it).
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu["load generator (this process, wrk)"] += children.ru_utime + children.ru_stime
        cpu["whole machine"] = machine_busy_s()
        return cpu

    async def run(
        self, drive: Driver, *, warm_up: Driver, concurrency: int, delivered: Callable[[int], Awaitable[bool]]
    ) -> None:
        """Warm up (200 sends, until delivered), then ``drive`` the load and wait until every send
        it made is delivered (``delivered(n)``: at least n delivered so far)."""
        await warm_up()  # also lets the workers join their group
        await wait_until(lambda: delivered(200), 60)
        self.concurrency = concurrency
        before = self._cpu()
        start = time.perf_counter()
        load = await drive()
        self.count, self.accept_s, self.p50_s, self.p99_s = load.sent, load.elapsed_s, load.p50_s, load.p99_s
        await wait_until(lambda: delivered(200 + load.sent), 600, 0.05)
        self.delivered_s = time.perf_counter() - start
        after = self._cpu()
        self.cpu_ms = {name: (after[name] - before[name]) * 1000 / load.sent for name in after}


def print_figures(title: str, m: Measurement) -> None:
    print(f"\n{title}: {m.count} notifications, {m.concurrency} concurrent clients\n")
    print(f"{'accepted/s':44} {m.count / m.accept_s:10.0f}")
    print(f"{'accept latency p50 (ms)':44} {m.p50_s * 1000:10.1f}")
    print(f"{'accept latency p99 (ms)':44} {m.p99_s * 1000:10.1f}")
    print(f"{'delivered/s end to end (to sent)':44} {m.count / m.delivered_s:10.0f}")
    print(f"{'time to last sent after first send (s)':44} {m.delivered_s:10.2f}")
    if m.unrecorded_s is not None:
        print(f"{'provider accepted -> recorded p50 (ms)':44} {m.unrecorded_s[0] * 1000:10.1f}")
        print(f"{'provider accepted -> recorded p99 (ms)':44} {m.unrecorded_s[1] * 1000:10.1f}")
    for name, ms in m.cpu_ms.items():
        print(f"{'CPU ms per notification, ' + name:44} {ms:10.3f}")


@dataclass(frozen=True)
class Pipeline:
    """A running Clarion pipeline: its API, the bench tenant's key, its database, its processes."""

    api_url: str
    key: str
    database_url: str
    processes: dict[str, int]
    broker_pid: int | None


Prepare = Callable[[str, TenantInfo], Awaitable[None]]


@asynccontextmanager
async def pipeline(
    plan: LoadPlan, workers: int = 1, api_workers: int = 1, *, prepare: Prepare | None = None
) -> AsyncIterator[Pipeline]:
    """A Tansu broker, a fresh database (dropped on exit), the API, the relay and ``workers``
    workers for ``plan.channel``; ``prepare(database_url, tenant)`` runs before they start."""
    broker = TansuBroker()
    broker.start()
    url = await fresh_database("clarion_bench")
    procs: list[ClarionProcess] = []
    try:
        await create_topics(broker.bootstrap, partitions=4)
        settings = Settings(
            database_url=url,
            kafka_bootstrap=broker.bootstrap,
            api_port=free_port(),
            env="test",
            db_pool_size=20,
        )
        engine = create_engine(url, pool_size=1)
        tenant = await make_tenant(engine)
        await engine.dispose()
        if prepare is not None:
            await prepare(url, tenant)
        api = ("api",) if api_workers == 1 else ("api", "--workers", str(api_workers))
        procs = [ClarionProcess(settings, *api), ClarionProcess(settings, "relay")]
        procs += [ClarionProcess(settings, "worker", plan.channel) for _ in range(workers)]
        for p in procs:
            p.start()
        api_url = f"http://127.0.0.1:{settings.api_port}"
        await wait_until(lambda: ready(api_url), 30)
        processes = {f"{i} {' '.join(p.args)}": p.pid for i, p in enumerate(procs)}
        if api_workers > 1:  # the supervisor idles: its API processes do the work
            await wait_until(lambda: len(children_of(procs[0].pid)) == api_workers, 30)
            processes.update({f"0 api process {pid}": pid for pid in children_of(procs[0].pid)})
        yield Pipeline(api_url, tenant.key, url, processes, broker.pid)
    finally:
        for p in procs:
            p.stop(10)
        broker.stop()
        await drop_database(url)


async def measure(p: Pipeline, plan: LoadPlan, drive: Driver | None = None) -> Measurement:
    """One ``Measurement.run`` of ``plan`` (or ``drive``) on a running pipeline; only notifications
    created from now on count as delivered, so it can run more than once, or on a filled log."""
    conn = await asyncpg.connect(asyncpg_dsn(p.database_url))
    try:
        since = await conn.fetchval("SELECT now()")
        measurement = Measurement(p.processes, broker_pid=p.broker_pid)
        await measurement.run(
            drive or plan.driver(p.api_url, p.key),
            warm_up=plan.warm_up(p.api_url, p.key),
            concurrency=plan.concurrency,
            delivered=lambda n: count_at_least(conn, "sent", n, since=since),
        )
        measurement.unrecorded_s = await unrecorded_s(conn, since=since)
    finally:
        await conn.close()
    return measurement


# When a send's provider call was accepted and when its outcome's record began (RECORD's now()):
# a worker killed between the two leaves the call unrecorded, and it is made again after the lease.
UNRECORDED = """
SELECT coalesce(percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY extract(epoch FROM n.updated_at - a.finished_at)),
                ARRAY[0, 0]::float8[])
  FROM notifications n JOIN delivery_attempts a ON a.notification_id = n.id
 WHERE n.created_at >= $1 AND n.status = 'sent' AND a.outcome = 'sent'
"""


async def unrecorded_s(conn: asyncpg.Connection, *, since: dt.datetime) -> tuple[float, float] | None:
    """p50 and p99 of how long a sent notification's accepted provider call stayed unrecorded
    (None on a database without Clarion's attempts: the reference pipeline's)."""
    if await conn.fetchval("SELECT to_regclass('delivery_attempts')") is None:
        return None
    p50, p99 = await conn.fetchval(UNRECORDED, since)
    return float(p50), float(p99)


def describe(plan: LoadPlan, workers: int = 1, api_workers: int = 1) -> str:
    route = "POST /v1/notifications" + ("" if plan.batch == 1 else "/batch")
    return (
        f"Clarion ({route}, {plan.channel}, {api_workers} API process(es), {workers} worker process(es), "
        f"relay apart; load: {plan.describe()})"
    )


async def main(
    plan: LoadPlan, workers: int = 1, api_workers: int = 1, *, webhook_endpoint: bool = False
) -> Measurement:
    prepare = add_webhook_endpoint if webhook_endpoint else None
    async with pipeline(plan, workers, api_workers, prepare=prepare) as p:
        measurement = await measure(p, plan)
        queued = await queued_deliveries(p.database_url) if webhook_endpoint else 0
    print_figures(describe(plan, workers, api_workers), measurement)
    if webhook_endpoint:
        print(f"{'webhook deliveries queued (incl. warm-up)':44} {queued:10d}")
    return measurement


async def count_at_least(
    conn: asyncpg.Connection, status: str, at_least: int, *, since: dt.datetime = EPOCH
) -> bool:
    """At least ``at_least`` rows of the connection's ``notifications`` table created at or after
    ``since`` have ``status`` (a ``since`` of today's run skips the partitions of other days)."""
    sql = "SELECT count(*) FROM notifications WHERE status = $1 AND created_at >= $2"
    return int(await conn.fetchval(sql, status, since)) >= at_least


async def compare(plan: LoadPlan, pairs: int) -> None:
    """Clarion and the reference pipeline (``bench.reference``), one after the other, same load,
    ``pairs`` times; prints every pair and the median of each ratio."""
    from bench.reference import run_reference

    rows: list[dict[str, tuple[float, float]]] = []
    for _ in range(pairs):
        ours = await main(plan)
        theirs = await run_reference(plan)
        rows.append(
            {
                "accepted/s": (ours.count / ours.accept_s, theirs.count / theirs.accept_s),
                "delivered/s end to end": (ours.count / ours.delivered_s, theirs.count / theirs.delivered_s),
                "accept p99 (ms)": (ours.p99_s * 1000, theirs.p99_s * 1000),
                "whole-machine CPU ms per notification": (
                    ours.cpu_ms["whole machine"], theirs.cpu_ms["whole machine"],
                ),
            }
        )  # fmt: skip
    print(f"\n{pairs} pair(s), load: {plan.describe()}; per pair: Clarion / reference = ratio")
    for name in rows[0]:
        cells = "   ".join(f"{a:,.1f} / {b:,.1f} = {a / b:.2f}" for a, b in (row[name] for row in rows))
        median = statistics.median(a / b for a, b in (row[name] for row in rows))
        print(f"{name:40} {cells}   median ratio {median:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=10_000, help="sends, with --load python")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long wrk sends, with --load wrk")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--channel", default="email", choices=["email", "sms"])
    parser.add_argument("--workers", type=int, default=1, help="worker processes for the channel")
    parser.add_argument("--api-workers", type=int, default=1, help="clarion api --workers N")
    parser.add_argument(
        "--batch", type=int, default=1, help="notifications per request (>1: POST /v1/notifications/batch)"
    )
    parser.add_argument(
        "--load", default="wrk", choices=["wrk", "python"], help="load generator (batches: python)"
    )
    parser.add_argument(
        "--webhook-endpoint",
        action="store_true",
        help="the bench tenant has a webhook endpoint (never called)",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="then run the reference pipeline (bench.reference) under the same load and compare",
    )
    parser.add_argument(
        "--pairs", type=int, default=1, help="with --reference: Clarion/reference pairs to run"
    )
    args = parser.parse_args()
    plan = LoadPlan(args.load, args.count, args.seconds, args.concurrency, args.channel, args.batch)
    if args.reference:
        asyncio.run(compare(plan, args.pairs))
    else:
        asyncio.run(main(plan, args.workers, args.api_workers, webhook_endpoint=args.webhook_endpoint))
