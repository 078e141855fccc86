"""What operators see: queue depth, lag and age per channel and lane, and the Prometheus queue gauges.

Two sources, on purpose:
- **Kafka** (``clarion.lag``): records each consumer group has not committed yet, per partition.
  This is cluster-wide: it carries no tenant data.
- **The log** (PostgreSQL): notifications not yet in a final status, their age, counts by status
  and throughput. In ``GET /v1/ops/queues`` these are the calling tenant's; the Prometheus gauges
  (``clarion_queue_depth``, ``clarion_oldest_undelivered_age_seconds``) cover every tenant.

Lanes: ``main`` and ``bulk`` hold notifications waiting for a first attempt (by priority),
``retry`` those waiting for a later attempt (``retrying``/``delayed``), ``dlq`` the dead ones.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from datetime import UTC, datetime

import sqlalchemy as sa
from pydantic import BaseModel, Field
from sqlalchemy.ext.asyncio import AsyncEngine

from api.ops_log import LogOut, read_log
from clarion import metrics
from clarion.lag import LagReader, LagUnavailable, PartitionLag, lane_topics
from providers.registry import REAL_PROVIDERS
from schema.enums import TERMINAL_STATUSES, Channel
from schema.messages import LANES
from schema.shown_status import SHOWN_STATUS_SQL

_TERMINAL = tuple(sorted(s.value for s in TERMINAL_STATUSES))
BREAKER_NAMES = {0: "closed", 1: "half_open", 2: "open"}

# Waiting notifications per channel and lane; the age counts from when each was due to go out.
_PENDING_SQL = """
SELECT channel,
       CASE WHEN status IN ('retrying', 'delayed') THEN 'retry'
            WHEN priority = 'bulk' THEN 'bulk' ELSE 'main' END AS lane,
       count(*) AS depth,
       extract(epoch FROM now() - min(coalesce(send_at, created_at))
               FILTER (WHERE coalesce(not_before, send_at, created_at) <= now())) AS oldest_age_s
  FROM notifications
 WHERE status IN ('accepted', 'queued', 'sending', 'retrying', 'delayed', 'scheduled') {tenant}
 GROUP BY 1, 2
"""

# No index covers `dead` (a partial index would): a scan, so the gauges refresh at most once a second.
_DEAD_SQL = "SELECT channel, count(*) AS n FROM notifications WHERE status = 'dead' {tenant} GROUP BY channel"

_COUNTS = """
SELECT channel,
       CASE WHEN priority = 'bulk' THEN 'bulk' ELSE 'main' END AS lane,
       {shown_status} AS status,
       count(*) AS n,
       count(*) FILTER (WHERE created_at >= now() - interval '60 seconds') AS accepted_1m,
       count(*) FILTER (WHERE status = ANY(:terminal) AND updated_at >= now() - interval '60 seconds')
           AS completed_1m
  FROM notifications
 WHERE {tenant} created_at >= now() - make_interval(secs => :window_s)
 GROUP BY 1, 2, 3
"""
_COUNTS_SQL = sa.text(_COUNTS.format(tenant="tenant_id = :tenant AND", shown_status=SHOWN_STATUS_SQL))
_ALL_COUNTS_SQL = sa.text(_COUNTS.format(tenant="", shown_status=SHOWN_STATUS_SQL))


async def _tenant_view() -> tuple[None, str]:
    return None, "cluster-wide figures (Kafka offsets and lag) need the operator token"


class PartitionOut(BaseModel):
    partition: int
    end_offset: int
    committed_offset: int | None = Field(description="None when the group never committed here")
    lag: int


class LaneOut(BaseModel):
    lane: str
    topic: str
    group: str
    depth: int = Field(description="notifications waiting in this lane (from the log)")
    lag: int | None = Field(
        description="records the consumer group has not committed (None: Kafka unreachable)"
    )
    oldest_age_s: float | None = Field(description="age of the oldest due notification waiting here")
    accepted_last_min: int = 0
    completed_last_min: int = 0
    partitions: list[PartitionOut] = Field(default_factory=list)


class ChannelOut(BaseModel):
    channel: Channel
    depth: int
    lag: int | None
    oldest_age_s: float | None
    accepted_last_min: int
    completed_last_min: int = Field(description="notifications that reached a final status in the last 60 s")
    dlq: int = Field(description="dead notifications (retries exhausted) waiting for a redrive")
    counts: dict[str, int] = Field(description="notifications created in the window, by status")
    breakers: dict[str, str] = Field(
        description="provider -> closed | half_open | open, as this process knows it"
    )
    lanes: list[LaneOut]


class KafkaStatus(BaseModel):
    available: bool
    error: str | None = None


class QueuesOut(BaseModel):
    generated_at: datetime
    window_s: int
    kafka: KafkaStatus
    log: LogOut
    channels: list[ChannelOut]


def breaker_states() -> dict[str, str]:
    """Provider -> breaker state from ``clarion_breaker_state`` (empty until a breaker reports)."""
    states: dict[str, str] = {}
    for family in metrics.BREAKER_STATE.collect():
        for sample in family.samples:
            provider = sample.labels.get("provider")
            if provider:
                states[provider] = BREAKER_NAMES.get(int(sample.value), str(sample.value))
    return states


def _providers_of(channel: Channel) -> set[str]:
    names = {"sandbox"}
    for (ch, _platform), (field_name, adapter) in REAL_PROVIDERS.items():
        if ch is channel:
            names.add(str(getattr(adapter, "name", field_name)))
    return names


class QueueMonitor:
    """Reads queue figures for the ops API and keeps the Prometheus queue gauges fresh."""

    def __init__(
        self, *, engine: AsyncEngine, bootstrap: str, retention_days: int = 30, kafka_timeout_s: float = 3.0
    ) -> None:
        self.engine = engine
        self.retention_days = retention_days
        self.lag = LagReader(bootstrap, timeout_s=kafka_timeout_s)
        self._gauges_at = 0.0
        self._gauges_lock = asyncio.Lock()

    async def close(self) -> None:
        await self.lag.close()

    async def _kafka(self) -> tuple[list[PartitionLag] | None, str | None]:
        try:
            return await self.lag.read(), None
        except LagUnavailable as exc:
            metrics.LAG_READ_ERRORS.inc()
            return None, str(exc)

    async def _pending(self, tenant_id: str | None) -> dict[tuple[str, str], tuple[int, float | None]]:
        sql = _PENDING_SQL.format(tenant="AND tenant_id = :tenant" if tenant_id is not None else "")
        async with self.engine.connect() as conn:
            rows = (await conn.execute(sa.text(sql), {"tenant": tenant_id})).all()
        return {
            (r.channel, r.lane): (int(r.depth), float(r.oldest_age_s) if r.oldest_age_s is not None else None)
            for r in rows
        }

    async def _dead(self, tenant_id: str | None) -> dict[str, int]:
        sql = _DEAD_SQL.format(tenant="AND tenant_id = :tenant" if tenant_id is not None else "")
        async with self.engine.connect() as conn:
            rows = (await conn.execute(sa.text(sql), {"tenant": tenant_id})).all()
        return {r.channel: int(r.n) for r in rows}

    async def report(self, *, tenant_id: str | None, window_s: int) -> QueuesOut:
        """Per channel and lane: waiting, counts and throughput from the log.

        With a ``tenant_id`` (a tenant admin): that tenant's figures only, and no Kafka figures (the
        offsets and lag of a shared topic are every tenant's traffic): ``kafka.available`` false,
        lags ``None``. Without one (the platform operator): every tenant, and Kafka lag per
        partition, ``None`` when the broker cannot be read.
        """
        kafka = self._kafka() if tenant_id is None else _tenant_view()
        (partitions, kafka_error), pending, dead, log = await asyncio.gather(
            kafka,
            self._pending(tenant_id),
            self._dead(tenant_id),
            read_log(engine=self.engine, retention_days=self.retention_days, operator=tenant_id is None),
        )
        counts_sql = _COUNTS_SQL if tenant_id is not None else _ALL_COUNTS_SQL
        async with self.engine.connect() as conn:
            counted = (
                await conn.execute(
                    counts_sql, {"tenant": tenant_id, "window_s": window_s, "terminal": list(_TERMINAL)}
                )
            ).all()
        by_status: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        per_lane: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
        for r in counted:
            by_status[r.channel][r.status] += int(r.n)
            per_lane[(r.channel, r.lane)][0] += int(r.accepted_1m)
            per_lane[(r.channel, r.lane)][1] += int(r.completed_1m)
        by_topic: dict[str, list[PartitionLag]] = defaultdict(list)
        for p in partitions or []:
            by_topic[p.topic].append(p)
        breakers = breaker_states()
        channels: list[ChannelOut] = []
        for channel in Channel:
            lanes: list[LaneOut] = []
            for lt in lane_topics([channel]):
                depth, age = pending.get((channel.value, lt.lane), (0, None))
                if lt.lane == "dlq":
                    depth = dead.get(channel.value, 0)
                parts = by_topic.get(lt.topic, [])
                lanes.append(
                    LaneOut(
                        lane=lt.lane,
                        topic=lt.topic,
                        group=lt.group,
                        depth=depth,
                        lag=sum(p.lag for p in parts) if partitions is not None else None,
                        oldest_age_s=age,
                        accepted_last_min=per_lane[(channel.value, lt.lane)][0],
                        completed_last_min=per_lane[(channel.value, lt.lane)][1],
                        partitions=[
                            PartitionOut(
                                partition=p.partition,
                                end_offset=p.end_offset,
                                committed_offset=p.committed_offset,
                                lag=p.lag,
                            )
                            for p in parts
                        ],
                    )
                )
            waiting = [lane for lane in lanes if lane.lane != "dlq"]
            ages = [lane.oldest_age_s for lane in waiting if lane.oldest_age_s is not None]
            lags = [lane.lag for lane in waiting if lane.lag is not None]
            channels.append(
                ChannelOut(
                    channel=channel,
                    depth=sum(lane.depth for lane in waiting),
                    lag=sum(lags) if partitions is not None else None,
                    oldest_age_s=max(ages) if ages else None,
                    accepted_last_min=sum(lane.accepted_last_min for lane in lanes),
                    completed_last_min=sum(lane.completed_last_min for lane in lanes),
                    dlq=dead.get(channel.value, 0),
                    counts=dict(sorted(by_status[channel.value].items())),
                    breakers={p: s for p, s in breakers.items() if p in _providers_of(channel)},
                    lanes=lanes,
                )
            )
        return QueuesOut(
            generated_at=datetime.now(UTC),
            window_s=window_s,
            kafka=KafkaStatus(available=partitions is not None, error=kafka_error),
            log=log,
            channels=channels,
        )

    async def refresh_gauges(self, *, min_interval_s: float = 1.0) -> None:
        """Set the queue gauges from Kafka and the whole log (at most once per ``min_interval_s``).

        When Kafka cannot be read the lag gauges keep their last values and
        ``clarion_lag_read_errors_total`` counts the failure.
        """
        async with self._gauges_lock:
            if time.monotonic() - self._gauges_at < min_interval_s:
                return
            (partitions, _), pending, dead = await asyncio.gather(
                self._kafka(), self._pending(None), self._dead(None)
            )
            self._gauges_at = time.monotonic()
        for channel in Channel:
            ages = []
            for lane in LANES:
                if lane == "dlq":
                    continue
                depth, age = pending.get((channel.value, lane), (0, None))
                metrics.QUEUE_DEPTH.labels(channel.value, lane).set(depth)
                metrics.OLDEST_WAITING_AGE.labels(channel.value, lane).set(age or 0.0)
                if age is not None:
                    ages.append(age)
            metrics.OLDEST_UNDELIVERED_AGE.labels(channel.value).set(max(ages) if ages else 0.0)
        for channel in Channel:
            metrics.DLQ_SIZE.labels(channel.value).set(dead.get(channel.value, 0))
        for p in partitions or ():
            metrics.CONSUMER_LAG.labels(p.topic, str(p.partition), p.group).set(p.lag)
            metrics.TOPIC_END_OFFSET.labels(p.topic, str(p.partition)).set(p.end_offset)
