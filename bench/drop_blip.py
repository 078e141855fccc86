"""Does dropping a day of the log make a visible blip in accept latency? Many drops in one load,
each held against a stretch of the same run in which nothing is dropped.

    .venv/bin/python -m bench.drop_blip [--rows 3000000] [--drops 10] [--every 6] [--concurrency 64]

``bench.growth`` drops one day per run, so each run is one comparison, and its slowest-stretch test
passes by chance about one run in eight with no blip at all: five runs could neither show a blip nor
rule one out (README, "Benchmarks"). Here one database is filled with ``--rows`` notifications over
the 30 days before today (``bench/growth_fill.py``), then loaded as ``bench.e2e`` loads it (wrk, the
API, one email worker, the relay) for ``(drops + 1) * every`` seconds. Every ``--every`` seconds the
relay's upkeep (``commands.runner.log_maintainer``) runs with its clock one more day ahead, so each
run drops the next-oldest day of every log table, as the first run after each midnight would; the
days those runs create are made before the load. A probe client beside wrk stamps every send.

Each drop is paired with a control stretch as long, half an interval later. A drop's stretch is the
whole upkeep run, from its start to its end: since the upkeep spaces its detaches and drops apart
(``CLARION_LOG_STEP_PAUSE_S``, ~10 pauses a run) that is the whole window in which it works, pauses
included, so ``--every`` must be over twice a run (a run shorter than half an interval is checked).
A probe send belongs to a stretch when it was in flight during it. Printed: each drop's time and the slowest send in flight
during it and during its control; the pooled p50/p90/p99/max of both sets; refusals; and a sign
test: of the drops, how many had a slower slowest send than their controls, and the chance of at
least that many if dropping changed nothing (each pair a coin toss); the same for the median send.
No visible blip: nothing refused, and the slowest sends' chance at least 5%.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import logging
import math
import statistics
import time
from dataclasses import dataclass

import asyncpg

from bench.e2e import measure, pipeline, print_figures
from bench.growth_drop import Sample, make_days_ahead, probe
from bench.growth_fill import DAYS, fill
from bench.load import Load, LoadPlan
from bench.wrk_load import wrk_drive
from clarion.log_maintenance import utc_today
from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from commands.runner import log_maintainer
from harness.tenants import TenantInfo

SIGNIFICANT = 0.05


@dataclass(frozen=True, slots=True)
class Stretch:
    """A span of the load (seconds since it began) and the probe sends in flight during it."""

    start_s: float
    end_s: float
    latencies_s: list[float]

    @staticmethod
    def of(samples: list[Sample], start_s: float, end_s: float) -> Stretch:
        inside = [s.latency_s for s in samples if s.at_s <= end_s and s.at_s + s.latency_s >= start_s]
        return Stretch(start_s, end_s, inside)

    @property
    def slowest_s(self) -> float:
        return max(self.latencies_s, default=0.0)


@dataclass(frozen=True, slots=True)
class Pair:
    """One drop (``dropped`` names the partitions it removed) and its control stretch."""

    drop: Stretch
    control: Stretch
    dropped: list[str]


def at_least(k: int, n: int) -> float:
    """The chance of ``k`` or more heads in ``n`` fair coin tosses."""
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


class RepeatedDrops:
    """A driver for ``bench.e2e.measure``: wrk's load, the probe beside it, and ``drops`` upkeep
    runs ``every_s`` apart, the k-th with its clock k days ahead."""

    def __init__(
        self, database_url: str, api_url: str, key: str, plan: LoadPlan, *, drops: int, every_s: float
    ):
        self.database_url, self.api_url, self.key, self.plan = database_url, api_url, key, plan
        self.drops, self.every_s = drops, every_s
        self.samples: list[Sample] = []
        self.runs: list[tuple[float, float, list[str]]] = []  # start, end, dropped
        self.work_s: list[float] = []  # each run's longest stretch of work between its pauses
        self.refused = 0

    async def _drop_every(self, t0: float) -> None:
        maintainer = log_maintainer(Settings(database_url=self.database_url, env="test"))
        for k in range(1, self.drops + 1):
            await asyncio.sleep(max(0.0, t0 + k * self.every_s - time.perf_counter()))
            ahead = dt.datetime.now(dt.UTC) + dt.timedelta(days=k)
            maintainer.clock = lambda ahead=ahead: ahead  # type: ignore[misc]
            start = time.perf_counter()
            report = await maintainer.run_once()
            self.runs.append((start - t0, time.perf_counter() - t0, report.dropped))
            self.work_s.append(report.longest_work_s)

    async def drive(self) -> Load:
        t0, stop = time.perf_counter(), asyncio.Event()
        probing = asyncio.create_task(probe(self.api_url, self.key, self.plan.channel, t0=t0, stop=stop))
        dropping = asyncio.create_task(self._drop_every(t0))
        try:
            load = await wrk_drive(self.api_url, self.key, self.plan.seconds, self.plan.concurrency,
                                   self.plan.channel, refusals_ok=True)  # fmt: skip
        finally:
            stop.set()
        self.samples = await probing
        await dropping
        self.refused = load.refused + sum(not s.accepted for s in self.samples)
        accepted = sum(s.accepted for s in self.samples)
        return Load(load.sent + accepted, load.elapsed_s, load.p50_s, load.p99_s, load.refused)

    def pairs(self) -> list[Pair]:
        half = self.every_s / 2
        return [
            Pair(Stretch.of(self.samples, a, b), Stretch.of(self.samples, a + half, b + half), dropped)
            for a, b, dropped in self.runs
        ]


def percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return "too few sends"
    q = statistics.quantiles(values, n=100, method="inclusive")
    return f"{len(values):6} sends  p50 {q[49] * 1000:6.1f}  p90 {q[89] * 1000:6.1f}  p99 {q[98] * 1000:6.1f}  max {max(values) * 1000:6.1f} ms"


def report(drops: RepeatedDrops) -> None:
    pairs = drops.pairs()
    print(
        f"\n{len(pairs)} drops during the load, {drops.every_s:g} s apart; each against the stretch {drops.every_s / 2:g} s later:"
    )
    print(
        f"{'#':>3} {'at (s)':>8} {'took (s)':>9} {'work (s)':>9} {'slowest in flight, drop / control (ms)':>40}  dropped"
    )
    for i, (p, work) in enumerate(zip(pairs, drops.work_s, strict=True), 1):
        took = p.drop.end_s - p.drop.start_s
        print(f"{i:3} {p.drop.start_s:8.1f} {took:9.3f} {work:9.3f} {p.drop.slowest_s * 1000:19.1f} / {p.control.slowest_s * 1000:<18.1f}  "
              f"{', '.join(p.dropped)}")  # fmt: skip
    during = [x for p in pairs for x in p.drop.latencies_s]
    control = [x for p in pairs for x in p.control.latencies_s]
    print(f"{'in flight during a drop':26} {percentiles(during)}")
    print(f"{'in flight during a control':26} {percentiles(control)}")
    print(f"{'the whole run':26} {percentiles([s.latency_s for s in drops.samples])}")
    slower = sum(p.drop.slowest_s > p.control.slowest_s for p in pairs)
    chance = at_least(slower, len(pairs))
    typical = [p for p in pairs if p.drop.latencies_s and p.control.latencies_s]
    median_slower = sum(
        statistics.median(p.drop.latencies_s) > statistics.median(p.control.latencies_s) for p in typical
    )
    print(f"drop's median send slower than its control's in {median_slower} of {len(typical)}; chance of that "
          f"many or more with no effect: {at_least(median_slower, len(typical)):.3f}")  # fmt: skip
    longest = max(p.drop.end_s - p.drop.start_s for p in pairs)
    work = max(drops.work_s)
    print(f"{'upkeep runs: the longest (s)':26} {longest:.3f}, its longest stretch of work between pauses "
          f"{work:.3f}   (target < 1 s: {'met' if work < 1 else 'NOT met'})")  # fmt: skip
    if longest > drops.every_s / 2:
        print(f"a run took over half an interval ({drops.every_s / 2:g} s): its stretch overlaps its control")
    print(f"{'sends refused':26} {drops.refused}")
    clean = drops.refused == 0 and chance >= SIGNIFICANT
    print(f"drop slower than its control in {slower} of {len(pairs)}; chance of that many or more with no blip: "
          f"{chance:.3f} (no visible blip: {'met' if clean else 'NOT met'})")  # fmt: skip


async def run(plan: LoadPlan, rows: int, drops: int, every_s: float) -> None:
    async def prepare(url: str, tenant: TenantInfo) -> None:
        print(f"filling {rows:,} notifications over {DAYS} days ...", flush=True)
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            await fill(conn, tenant_id=tenant.id, rows=rows, today=utc_today())
        finally:
            await conn.close()

    async with pipeline(plan, prepare=prepare) as p:
        repeated = RepeatedDrops(p.database_url, p.api_url, p.key, plan, drops=drops, every_s=every_s)
        await make_days_ahead(p.database_url, days=drops)
        measured = await measure(p, plan, repeated.drive)
    print_figures(
        f"The load with {drops} drops, wrk {plan.seconds:g} s, {plan.concurrency} connections", measured
    )
    report(repeated)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows", type=int, default=3_000_000, help="notifications in the log before the load"
    )
    parser.add_argument("--drops", type=int, default=10)
    parser.add_argument("--every", type=float, default=6.0, help="seconds between two drops")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    if not 1 <= args.drops < DAYS:
        parser.error(f"--drops must be 1 .. {DAYS - 1}: each drops one of the {DAYS} filled days")
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s", level=logging.WARNING)
    for name in ("schema.partition_drops", "schema.partitions"):  # each detach's and drop's time
        logging.getLogger(name).setLevel(logging.INFO)
    plan = LoadPlan("wrk", 0, (args.drops + 1) * args.every, args.concurrency)
    asyncio.run(run(plan, args.rows, args.drops, args.every))
