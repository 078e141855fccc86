"""The retention loop dropping the oldest day while ``bench.e2e``'s load runs, for ``bench.growth``.

wrk reports one latency distribution per run, so a probe client beside it (one connection, one
send after another, the same body as ``bench.load``) stamps every accept it makes; the seconds
around the drop are compared with the rest of the run, and with every other stretch of it as
long (``slowest_per_window``). Refused sends are counted, not fatal: a
refusal during the drop is what this run is looking for. Halfway through the load the relay's own
upkeep (``commands.runner.log_maintainer``, what runs hourly in the relay) runs once with its clock
set to tomorrow, so it drops the oldest filled day of every log table as the first run after
midnight would. The days that run would create a week ahead are made before the load
(``make_days_ahead``), so the run's time is the drops' (and the gauges' few queries), not the
creates'.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import statistics
import time
from dataclasses import dataclass

import aiohttp
import asyncpg

from bench.e2e import Pipeline
from bench.load import Load, LoadPlan, body
from bench.wrk_load import wrk_drive
from clarion.log_maintenance import MaintenanceReport, maintain, utc_today
from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from commands.runner import log_maintainer

MARGIN_S = 1.0  # "around the drop": from this long before it starts to this long after it ends


@dataclass(frozen=True, slots=True)
class Sample:
    """One probe send: when it started (seconds since the load began), how long it took, and
    whether it was accepted."""

    at_s: float
    latency_s: float
    accepted: bool


@dataclass(frozen=True, slots=True)
class Drop:
    """The upkeep run during the load: when it started and ended (seconds since the load began),
    what it did, or the error it ended with (the relay would log it and try again in an hour)."""

    start_s: float
    end_s: float
    report: MaintenanceReport | None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Latency:
    """Probe latencies of a stretch of the run (refused sends included: how long until the answer)."""

    count: int
    refused: int
    p50_s: float
    p99_s: float
    max_s: float

    @staticmethod
    def of(samples: list[Sample]) -> Latency:
        values = sorted(s.latency_s for s in samples) or [0.0]
        p99 = statistics.quantiles(values, n=100, method="inclusive")[98] if len(values) > 1 else values[0]
        refused = sum(not s.accepted for s in samples)
        return Latency(len(samples), refused, statistics.median(values), p99, values[-1])


async def make_days_ahead(database_url: str, *, days: int) -> None:
    """The partitions upkeep runs with their clocks 1 .. ``days`` days ahead would create, made
    now, so a run during a load is only its drops (and the gauges' few queries)."""
    settings = Settings(database_url=database_url, env="test")
    conn = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        for k in range(1, days + 1):
            await maintain(  # a retention no day reaches: this run only creates
                conn=conn,
                today=utc_today() + dt.timedelta(days=k),
                retention_days=36_500,
                partitions_ahead=settings.partition_days_ahead,
            )
    finally:
        await conn.close()


async def probe(url: str, key: str, channel: str, *, t0: float, stop: asyncio.Event) -> list[Sample]:
    """Send one notification after another until ``stop`` is set; the latency of each, and
    whether it was accepted (a refusal is a result here, not an error)."""
    samples: list[Sample] = []
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession(url, headers=headers) as session:
        while not stop.is_set():
            started = time.perf_counter()
            async with session.post("/v1/notifications", json=body(len(samples), channel)) as response:
                await response.read()
            samples.append(Sample(started - t0, time.perf_counter() - started, response.status == 202))
    return samples


class DropDuringLoad:
    """A driver for ``bench.e2e.measure``: ``plan``'s load, the probe beside it, and the drop
    ``after_s`` into it; ``samples`` and ``drop`` hold what was seen once it has run."""

    def __init__(self, p: Pipeline, plan: LoadPlan, *, after_s: float) -> None:
        self.pipeline, self.plan, self.after_s = p, plan, after_s
        self.samples: list[Sample] = []
        self.drop: Drop | None = None
        self.wrk_refused = 0

    async def make_days_ahead(self) -> None:
        """Before the load: the partitions the run during it would create (its clock a day on)."""
        await make_days_ahead(self.pipeline.database_url, days=1)

    async def _drop(self, t0: float) -> Drop:
        await asyncio.sleep(self.after_s)
        maintainer = log_maintainer(Settings(database_url=self.pipeline.database_url, env="test"))
        tomorrow = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
        maintainer.clock = lambda: tomorrow
        start = time.perf_counter()
        try:
            report = await maintainer.run_once()
        except asyncpg.PostgresError as error:
            return Drop(start - t0, time.perf_counter() - t0, None, f"{type(error).__name__}: {error}")
        return Drop(start - t0, time.perf_counter() - t0, report)

    async def drive(self) -> Load:
        p, plan = self.pipeline, self.plan
        t0, stop = time.perf_counter(), asyncio.Event()
        probing = asyncio.create_task(probe(p.api_url, p.key, plan.channel, t0=t0, stop=stop))
        dropping = asyncio.create_task(self._drop(t0))
        try:
            load = await wrk_drive(
                p.api_url, p.key, plan.seconds, plan.concurrency, plan.channel, refusals_ok=True
            )
        finally:
            stop.set()
        self.samples, self.drop = await probing, await dropping
        self.wrk_refused = load.refused
        # The probe's accepted sends are delivered too: the measurement waits for them as well.
        accepted = sum(s.accepted for s in self.samples)
        return Load(load.sent + accepted, load.elapsed_s, load.p50_s, load.p99_s, load.refused)

    def stretch(self) -> tuple[float, float]:
        """The stretch of the run "around the drop": ``MARGIN_S`` before it began to ``MARGIN_S``
        after it ended (seconds since the load began)."""
        if self.drop is None:
            raise RuntimeError("the load has not run yet")
        return self.drop.start_s - MARGIN_S, self.drop.end_s + MARGIN_S

    def around(self) -> tuple[Latency, Latency]:
        """Probe latency in ``stretch`` and over the rest of the run."""
        lo, hi = self.stretch()
        near = [s for s in self.samples if lo <= s.at_s <= hi]
        rest = [s for s in self.samples if not lo <= s.at_s <= hi]
        return Latency.of(near), Latency.of(rest)

    def other_windows(self) -> list[float]:
        """The slowest probe send of each stretch of the run as long as ``stretch``, tiled before
        and after it (a stretch with no send left out): what the drop's stretch is held against."""
        lo, hi = self.stretch()
        return slowest_per_window(self.samples, length_s=hi - lo, skip=(lo, hi), end_s=self.plan.seconds)

    def per_second(self) -> dict[int, float]:
        """The slowest probe send that started in each second of the run."""
        worst: dict[int, float] = {}
        for s in self.samples:
            worst[int(s.at_s)] = max(worst.get(int(s.at_s), 0.0), s.latency_s)
        return dict(sorted(worst.items()))


def slowest_per_window(
    samples: list[Sample], *, length_s: float, skip: tuple[float, float], end_s: float
) -> list[float]:
    """The slowest latency in each window of ``length_s`` tiled from the start of the run up to
    ``skip``'s start, and from ``skip``'s end up to ``end_s`` (windows with no sample are left
    out; so is a remainder shorter than ``length_s``: a shorter window would set a lower bar)."""
    lo, hi = skip

    def fits(span: float) -> int:  # how many whole windows; (20 - 11.2) / 2.2 is 3.999... in floats
        return int(max(0.0, span) / length_s + 1e-9)

    starts = [k * length_s for k in range(fits(lo))]
    starts += [hi + k * length_s for k in range(fits(end_s - hi))]
    worst = []
    for start in starts:
        inside = [s.latency_s for s in samples if start <= s.at_s < start + length_s]
        if inside:
            worst.append(max(inside))
    return worst
