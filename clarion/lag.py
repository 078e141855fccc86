"""Kafka queue depth and consumer lag: topic end offsets against the consumer groups' commits.

Every Clarion topic is read with the group that consumes it: ``clarion-<channel>`` (main lane),
``clarion-<channel>-bulk``, ``clarion-<channel>-retry``, ``clarion-<channel>-dlq`` (redrive). A
partition the group never committed on counts from the partition's first offset, so messages
published before any worker joined show up as lag. Offsets are fetched for explicit partitions:
the broker-wide "all offsets of a group" request (OffsetFetch with null topics) breaks on Tansu.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from schema.enums import Channel
from schema.messages import LANES, topic

log = logging.getLogger(__name__)


class LagUnavailable(Exception):
    """The broker could not be asked for offsets (down, unreachable or too slow)."""


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One partition of one topic as its consumer group sees it."""

    topic: str
    partition: int
    group: str
    end_offset: int
    committed_offset: int | None  # None: the group never committed on this partition
    lag: int  # records not yet committed by the group


@dataclass(frozen=True, slots=True)
class LaneTopic:
    channel: Channel
    lane: str
    topic: str
    group: str


def consumer_group(channel: Channel | str, lane: str) -> str:
    """The consumer group that reads ``channel``'s ``lane`` topic."""
    base = f"clarion-{Channel(channel).value}"
    return base if lane == "main" else f"{base}-{lane}"


def lane_topics(channels: Sequence[Channel] = tuple(Channel)) -> list[LaneTopic]:
    """Every (channel, lane) topic with its group, in display order."""
    return [
        LaneTopic(ch, lane, topic(ch, lane), consumer_group(ch, lane)) for ch in channels for lane in LANES
    ]


class LagReader:
    """Reads end offsets and committed offsets; keeps its connections between reads.

    ``read`` raises ``LagUnavailable`` when the broker cannot answer within ``timeout_s``; the next
    read reconnects, so a broker that comes back is picked up without restarting the process.
    """

    def __init__(self, bootstrap: str, *, timeout_s: float = 5.0) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self._admin: AIOKafkaAdminClient | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._lock = asyncio.Lock()

    async def read(self, lanes: Sequence[LaneTopic] | None = None) -> list[PartitionLag]:
        """Lag per partition of each lane's topic (topics that do not exist yet are left out)."""
        lanes = list(lanes) if lanes is not None else lane_topics()
        async with self._lock:
            try:
                return await asyncio.wait_for(self._read(lanes), self.timeout_s)
            except Exception as exc:
                await self._reset()
                raise LagUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def _connect(self) -> tuple[AIOKafkaAdminClient, AIOKafkaConsumer]:
        if self._admin is None or self._consumer is None:
            timeout_ms = int(self.timeout_s * 1000)
            admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=timeout_ms)
            consumer = AIOKafkaConsumer(
                bootstrap_servers=self.bootstrap,
                enable_auto_commit=False,
                request_timeout_ms=timeout_ms,
                fetch_max_wait_ms=10,
                max_partition_fetch_bytes=1024,
            )
            try:
                await admin.start()
                await consumer.start()
            except BaseException:
                await _quietly_close(admin, consumer)
                raise
            self._admin, self._consumer = admin, consumer
        return self._admin, self._consumer

    async def _read(self, lanes: list[LaneTopic]) -> list[PartitionLag]:
        admin, consumer = await self._connect()
        # Only describe topics that exist: describing a missing one would auto-create it.
        existing = set(await admin.list_topics())
        wanted = sorted({lane.topic for lane in lanes} & existing)
        described = await admin.describe_topics(wanted) if wanted else []
        partitions_of = {
            str(t["topic"]): sorted(int(p["partition"]) for p in t.get("partitions", ()))
            for t in described
            if not t.get("error_code")
        }
        by_lane = [
            (lane, [TopicPartition(lane.topic, p) for p in partitions_of[lane.topic]])
            for lane in lanes
            if lane.topic in partitions_of
        ]
        every = [tp for _, tps in by_lane for tp in tps]
        if not every:
            return []
        ends = await consumer.end_offsets(every)
        starts = await consumer.beginning_offsets(every)
        ends = await self._high_watermarks(consumer, ends, starts)
        result: list[PartitionLag] = []
        for lane, tps in by_lane:
            if not tps:
                continue
            committed = await admin.list_consumer_group_offsets(lane.group, partitions=tps)
            for tp in tps:
                meta = committed.get(tp)
                offset = meta.offset if meta is not None and meta.offset >= 0 else None
                end = ends[tp]
                base = offset if offset is not None else starts[tp]
                result.append(
                    PartitionLag(tp.topic, tp.partition, lane.group, end, offset, max(end - base, 0))
                )
        return result

    async def _high_watermarks(
        self, consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int], starts: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """End offsets corrected by a fetch's high watermark.

        Tansu 0.6 answers ListOffsets(latest) with the last *batch's* base offset + 1, so a batch of
        N records reads as 1; the high watermark in a fetch response is right on every broker. The
        fetch starts at the reported end, so on Kafka it carries no records.
        """
        filled = [tp for tp, end in ends.items() if end > starts.get(tp, 0)]
        if not filled:
            return ends
        consumer.assign(filled)
        for tp in filled:
            consumer.seek(tp, ends[tp])
        deadline = asyncio.get_running_loop().time() + self.timeout_s / 2
        while any(consumer.highwater(tp) is None for tp in filled):
            if asyncio.get_running_loop().time() > deadline:
                break
            await consumer.getmany(*filled, timeout_ms=20, max_records=1)
        corrected = dict(ends)
        for tp in filled:
            corrected[tp] = max(ends[tp], consumer.highwater(tp) or 0)
        consumer.pause(*filled)  # no background fetching between reads
        return corrected

    async def _reset(self) -> None:
        admin, consumer = self._admin, self._consumer
        self._admin = self._consumer = None
        await _quietly_close(admin, consumer)

    async def close(self) -> None:
        async with self._lock:
            await self._reset()


async def _quietly_close(admin: AIOKafkaAdminClient | None, consumer: AIOKafkaConsumer | None) -> None:
    for client in (consumer, admin):
        if client is None:
            continue
        try:
            await (client.stop() if isinstance(client, AIOKafkaConsumer) else client.close())
        except Exception:
            log.debug("closing a Kafka client failed", exc_info=True)
