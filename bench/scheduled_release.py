"""One tenant's scheduled sends coming due at one instant: do another tenant's sends wait behind them?

    .venv/bin/python -m bench.scheduled_release [--banked 20000] [--rate 1000] [--burst 100]
                                                [--other-rate 20] [--quiet 10] [--window 10]
                                                [--target-p99 1.0]

The pipeline of ``bench.e2e`` (the API, the relay and one email worker as separate processes, a
Tansu broker, a fresh database dropped afterwards), with Redis (``--redis-url``, given to every
process as ``CLARION_REDIS_URL``) as the limiter they share, so the API's accepts and the relay's
releases are charged to one budget. Before the processes start, the operator's rule gives every
tenant ``--rate`` sends a second: the row ``clarion limits set per-tenant --scope tenant --limit R
--period-s 1 --burst B`` stores (``rate_limit_rules``, no tenant).

Tenant A banks ``--banked`` sends for one instant T through ``POST /v1/notifications/batch``:
batches the rule admits at once, sent on a schedule at the rule's rate, every 429 waited out for
its ``Retry-After`` and counted. So the accepts respect the rule as any client's would. T lies past
the time banking takes at that rate (with a quarter to spare) plus the quiet stretch; a run whose
banking ends inside the quiet stretch stops with an error. From ``--quiet`` seconds before T,
tenant B sends one immediate notification every 1/``--other-rate`` s through ``POST
/v1/notifications``, until every one of A's sends is final; then the run waits until B's are too
(both clients: ``bench/scheduled_load.py``).

Read from the log afterwards (a row's ``created_at`` is its accept, a ``sent`` row's
``updated_at`` the worker's record of its send), it prints: A's release (sends sent, first to
last sent, sends/s, the first one's delay after T, A's rows by status), and B's accept-to-sent
latency p50/p90/p99/max for the sends accepted in the quiet stretch (before T) and during A's
release (from T to A's last send), and the slowest of the latter accepted in each ``--window``
seconds from T (a wait that grows through the release is a backlog, one that stays level is each
relay pass's batch). Target: B's p99 during the release within ``--target-p99``
(1 s), printed as met or NOT met. Before commit 1eb758a the relay released a banked instant all at
once: 102,100 sends banked at 2,000/s made B's sends wait 90 s.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import statistics
import time
from dataclasses import dataclass
from uuid import UUID

import asyncpg
import redis.asyncio as aioredis

from api.global_rules import set_global_rule
from api.rate_limits import RateLimitIn
from bench.e2e import pipeline
from bench.load import LoadPlan, drive
from bench.scheduled_load import bank, steady
from clarion.pg import asyncpg_dsn
from harness.services import wait_until
from harness.tenants import TenantInfo, make_tenant
from schema.db import create_engine

MAX_BATCH = 500  # sends per banking request (and never more than the rule admits at once)
PENDING = ("accepted", "queued", "scheduled", "sending", "retrying", "delayed")


@dataclass(frozen=True, slots=True)
class Release:
    """When a tenant's banked sends were sent: how many, the first and the last."""

    count: int
    first: dt.datetime
    last: dt.datetime

    @staticmethod
    def of(sent_at: list[dt.datetime]) -> Release:
        return Release(len(sent_at), min(sent_at), max(sent_at))

    @property
    def span_s(self) -> float:
        return (self.last - self.first).total_seconds()

    @property
    def per_s(self) -> float:
        """Sends a second from the first to the last (``inf`` when they were all sent at once)."""
        return (self.count - 1) / self.span_s if self.span_s > 0 else float("inf")


@dataclass(frozen=True, slots=True)
class Send:
    """One of tenant B's sends as the log holds it: accepted, and sent (None: not sent)."""

    accepted_at: dt.datetime
    sent_at: dt.datetime | None

    @property
    def latency_s(self) -> float | None:
        return None if self.sent_at is None else (self.sent_at - self.accepted_at).total_seconds()


def stretches(
    sends: list[Send], *, due_at: dt.datetime, release_end: dt.datetime
) -> tuple[list[Send], list[Send]]:
    """B's sends accepted in the quiet stretch (before ``due_at``), and those accepted while A's
    sends were due and going out (``due_at`` to ``release_end``, A's last send, both included)."""
    quiet = [s for s in sends if s.accepted_at < due_at]
    during = [s for s in sends if due_at <= s.accepted_at <= release_end]
    return quiet, during


def quantiles(latencies: list[float]) -> tuple[float, float, float, float]:
    """p50, p90, p99 and the max of ``latencies`` (at least two)."""
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return q[49], q[89], q[98], max(latencies)


def describe(sends: list[Send]) -> str:
    latencies = [x for s in sends if (x := s.latency_s) is not None]
    unsent = f", {len(sends) - len(latencies)} not sent" if len(latencies) < len(sends) else ""
    if len(latencies) < 2:
        return f"{len(sends):5} sends: too few sent to tell{unsent}"
    p50, p90, p99, top = quantiles(latencies)
    return f"{len(sends):5} sends  p50 {p50:7.3f}  p90 {p90:7.3f}  p99 {p99:7.3f}  max {top:7.3f} s{unsent}"


def verdict(during: list[Send], target_s: float) -> str:
    """Whether B's p99 during the release is within ``target_s``; an unsent send misses it."""
    latencies = [s.latency_s for s in during]
    if len(latencies) < 2:
        return "NOT measured (fewer than two sends during the release)"
    if any(x is None for x in latencies):
        return "NOT met (a send accepted during the release was not sent)"
    p99 = quantiles([x for x in latencies if x is not None])[2]
    return f"{'met' if p99 <= target_s else 'NOT met'} (p99 {p99:.3f} s, target {target_s:g} s)"


def slowest_by_window(sends: list[Send], *, start: dt.datetime, width_s: float) -> list[float | None]:
    """The slowest of ``sends`` accepted in each ``width_s`` from ``start`` (None: one not sent;
    a window without sends is 0), through the last window holding one."""
    slowest: dict[int, float | None] = {}
    for s in sends:
        w = int((s.accepted_at - start).total_seconds() // width_s)
        x, was = s.latency_s, slowest.get(w, 0.0)
        if w >= 0:
            slowest[w] = None if x is None or was is None else max(x, was)
    return [slowest.get(w, 0.0) for w in range(max(slowest, default=-1) + 1)]


async def settled(conn: asyncpg.Connection, tenant_id: str) -> bool:
    """None of the tenant's sends is still on its way (every one sent, failed, throttled ...)."""
    sql = "SELECT count(*) = 0 FROM notifications WHERE tenant_id = $1 AND status = ANY($2::text[])"
    return bool(await conn.fetchval(sql, tenant_id, list(PENDING)))


async def rule_keys(redis_url: str, rule_id: UUID, *, delete: bool = False) -> int:
    """The limiter keys of the run's rule (its id is new each run), deleted if ``delete``."""
    r = aioredis.Redis.from_url(redis_url)
    try:
        keys = [k async for k in r.scan_iter(match=f"*ingress:{rule_id}:*")]
        if delete and keys:
            await r.delete(*keys)
        return len(keys)
    finally:
        await r.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose


@dataclass
class Setup:
    """What ``prepare`` made before the processes started: the tenants and the operator's rule."""

    a: TenantInfo | None = None
    b: TenantInfo | None = None
    rule_id: UUID | None = None


async def run(args: argparse.Namespace) -> None:
    setup = Setup()

    async def prepare(url: str, tenant: TenantInfo) -> None:
        engine = create_engine(url, pool_size=1)
        try:
            setup.a, setup.b = tenant, await make_tenant(engine)
            rule = RateLimitIn(
                name="per-tenant", scope="tenant", limit=args.rate, period_s=1.0, burst=args.burst
            )
            setup.rule_id = (await set_global_rule(engine=engine, rule=rule))[0].id
        finally:
            await engine.dispose()

    os.environ["CLARION_REDIS_URL"] = args.redis_url  # bench.e2e's Settings, and so every process
    try:
        async with pipeline(LoadPlan("python", 0, 0.0, 1), prepare=prepare) as p:
            assert setup.a is not None and setup.b is not None and setup.rule_id is not None
            conn = await asyncpg.connect(asyncpg_dsn(p.database_url))
            try:
                await measure(args, p.api_url, conn, setup.a, setup.b, setup.rule_id)
            finally:
                await conn.close()
    finally:
        if setup.rule_id is not None:
            await rule_keys(args.redis_url, setup.rule_id, delete=True)


async def measure(
    args: argparse.Namespace,
    api_url: str,
    conn: asyncpg.Connection,
    a: TenantInfo,
    b: TenantInfo,
    rule_id: UUID,
) -> None:
    await drive(api_url, b.key, 20, 4, "email")  # the worker has joined its group once these are sent
    await wait_until(lambda: settled(conn, b.id), 60, 0.2)
    due_at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1.25 * args.banked / args.rate + args.quiet + 5)
    started = time.perf_counter()
    refused_a = await bank(api_url, a.key, args.banked, due_at=due_at, rate=args.rate,
                           batch=min(MAX_BATCH, args.rate + args.burst))  # fmt: skip
    banked_s = time.perf_counter() - started
    quiet_from = due_at - dt.timedelta(seconds=args.quiet)
    if dt.datetime.now(dt.UTC) >= quiet_from:
        raise SystemExit(f"banking took {banked_s:.1f} s, into the quiet stretch: try a lower --rate")
    if not await rule_keys(args.redis_url, rule_id):
        raise SystemExit("the API charged no Redis key for the rule: is Redis the limiter?")
    await asyncio.sleep((quiet_from - dt.datetime.now(dt.UTC)).total_seconds())  # the clock, not a condition
    stop = asyncio.Event()
    sender = asyncio.create_task(steady(api_url, b.key, rate=args.other_rate, stop=stop))
    try:
        await wait_until(lambda: settled(conn, a.id), 3 * args.banked / args.rate + 300, 0.25)
    finally:
        stop.set()
        ids, refused_b = await sender
    await wait_until(lambda: settled(conn, b.id), 600, 0.25)

    sql = "SELECT updated_at FROM notifications WHERE tenant_id = $1 AND status = 'sent'"
    release = Release.of([r["updated_at"] for r in await conn.fetch(sql, a.id)])
    sql = "SELECT status, count(*) AS n FROM notifications WHERE tenant_id = $1 GROUP BY status ORDER BY 1"
    statuses = ", ".join(f"{r['status']} {r['n']:,}" for r in await conn.fetch(sql, a.id))
    sql = "SELECT created_at, updated_at, status FROM notifications WHERE id = ANY($1::uuid[])"
    sends = [Send(r["created_at"], r["updated_at"] if r["status"] == "sent" else None)
             for r in await conn.fetch(sql, ids)]  # fmt: skip
    quiet, during = stretches(sends, due_at=due_at, release_end=release.last)

    load = "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nper-tenant rule: {args.rate:,}/s, burst {args.burst} (Redis, shared by the API and the relay); "
          f"load average at the end {load}")  # fmt: skip
    print(f"A banked {args.banked:,} sends for T = {due_at:%H:%M:%S.%f} UTC in {banked_s:.1f} s "
          f"({args.banked / banked_s:,.0f}/s; {refused_a} batches refused with 429 and resent)")  # fmt: skip
    print(f"A's release: {release.count:,} sent, the first {(release.first - due_at).total_seconds():.2f} s "
          f"after T, first to last {release.span_s:.2f} s, {release.per_s:,.0f} sends/s; A's rows: {statuses}")  # fmt: skip
    print(f"B: one immediate send every {1 / args.other_rate:g} s from T - {args.quiet:g} s, "
          f"{len(ids):,} accepted, {refused_b} refused; accept to sent:")  # fmt: skip
    print(f"  {'quiet stretch (before T)':36} {describe(quiet)}")
    print(f"  {'during the release (T to A last sent)':36} {describe(during)}")
    slowest = slowest_by_window(during, start=due_at, width_s=args.window)
    cells = " ".join("unsent" if x is None else f"{x:.2f}" for x in slowest)
    print(f"  the slowest accepted in each {args.window:g} s from T (s): {cells}")
    print(f"B's p99 during A's release within {args.target_p99:g} s: {verdict(during, args.target_p99)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--banked", type=int, default=20_000, help="tenant A's sends due at T")
    parser.add_argument("--rate", type=int, default=1_000, help="the per-tenant rule's sends a second")
    parser.add_argument("--burst", type=int, default=100, help="the rule's burst")
    parser.add_argument("--other-rate", type=float, default=20.0, help="tenant B's immediate sends a second")
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds B sends before T")
    parser.add_argument("--window", type=float, default=10.0, help="seconds a window of the release")
    parser.add_argument("--target-p99", type=float, default=1.0, help="seconds: B's p99 during A's release")
    parser.add_argument(
        "--redis-url", default=os.environ.get("CLARION_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    args = parser.parse_args()
    if args.banked < 2 or args.rate < 1 or args.other_rate <= 0 or args.quiet <= 0:
        parser.error("--banked >= 2, --rate >= 1, --other-rate > 0 and --quiet > 0")
    asyncio.run(run(args))
