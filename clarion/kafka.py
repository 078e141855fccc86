"""Kafka plumbing shared by every process: the producer and topic creation.

A message with a trace context is published with it in a ``traceparent`` record header.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from clarion.tracing import HEADER as TRACEPARENT
from schema.messages import NotificationMessage, all_topics, lane_for, topic

log = logging.getLogger(__name__)


class Publisher:
    """Publishes notification messages; ``publish_many`` returns the ids the broker acknowledged.

    The producer is started lazily and restarted after a failure, so a broker that was down (or
    replaced) is picked up again without restarting the process.
    """

    def __init__(self, bootstrap: str, *, send_timeout_s: float = 5.0) -> None:
        self.bootstrap = bootstrap
        self.send_timeout_s = send_timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def _get(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is None:
                producer = AIOKafkaProducer(
                    bootstrap_servers=self.bootstrap,
                    linger_ms=5,
                    max_batch_size=256 * 1024,
                    request_timeout_ms=int(self.send_timeout_s * 1000),
                    acks=1,
                )
                try:
                    await asyncio.wait_for(producer.start(), self.send_timeout_s)
                except BaseException:
                    await producer.stop()
                    raise
                self._producer = producer
            return self._producer

    async def _reset(self) -> None:
        async with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await producer.stop()
            except Exception:
                log.debug("producer stop failed", exc_info=True)

    async def publish_many(
        self, messages: list[NotificationMessage], *, lane: str | None = None
    ) -> list[str]:
        """Send every message; return the ids whose send the broker acknowledged."""
        if not messages:
            return []
        try:
            producer = await self._get()
            futures = [
                await producer.send(
                    topic(m.channel, lane or lane_for(m.priority)),
                    m.model_dump_json().encode(),
                    key=m.key(),
                    headers=[(TRACEPARENT, m.traceparent.encode())] if m.traceparent else None,
                )
                for m in messages
            ]
            results = await asyncio.wait_for(
                asyncio.gather(*futures, return_exceptions=True), self.send_timeout_s
            )
        except (KafkaError, OSError, TimeoutError) as exc:
            log.warning("publish failed, the relay will retry: %s", exc)
            await self._reset()
            return []
        acked = [
            str(m.id) for m, r in zip(messages, results, strict=True) if not isinstance(r, BaseException)
        ]
        if len(acked) < len(messages):
            await self._reset()
        return acked

    async def publish_raw(self, topic_name: str, value: bytes, key: bytes | None = None) -> None:
        producer = await self._get()
        await (await producer.send(topic_name, value, key=key))

    async def close(self) -> None:
        await self._reset()


async def create_topics(
    bootstrap: str, *, partitions: int, timeout_s: float = 20.0, names: Sequence[str] | None = None
) -> list[str]:
    """Create every Clarion topic (or each of ``names``) that does not exist yet; return the names
    created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in (all_topics() if names is None else names) if t not in existing]
        if missing:
            try:
                await admin.create_topics(
                    [NewTopic(name=t, num_partitions=partitions, replication_factor=1) for t in missing]
                )
            except TopicAlreadyExistsError:
                pass
        return missing
    finally:
        await admin.close()
