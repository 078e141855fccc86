"""One FastStream consumer app per channel: batch subscribers for the main and bulk lanes.

Offsets are committed (``AckPolicy.MANUAL``, one ack per batch) only after the batch's outcomes are
recorded: at-least-once from Kafka, effectively once at the provider thanks to the claim. Never
``ACK_FIRST`` (at-most-once) and never ``nack()`` (a hot redelivery loop). The bulk lane has its
own consumer group, so a marketing backlog never delays an OTP.
"""

from __future__ import annotations

import asyncio
import logging

from faststream import AckPolicy
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion import metrics
from clarion.kafka import Publisher
from clarion.settings import Settings
from providers.registry import ProviderSet, build_providers
from schema.db import create_engine
from schema.enums import Channel
from schema.messages import topic
from workers.db import create_pool
from workers.pipeline import Pipeline, decode
from workers.render import Renderer
from workers.retry import RetryPolicy
from workers.wiring import build_steps

log = logging.getLogger(__name__)


class Worker:
    """A channel worker. ``start`` opens the DB pool, providers and consumers; ``stop`` closes them."""

    def __init__(
        self,
        settings: Settings,
        channel: Channel,
        *,
        providers: ProviderSet | None = None,
        policy: RetryPolicy | None = None,
    ) -> None:
        if not settings.kafka_bootstrap:
            raise ValueError("CLARION_KAFKA_BOOTSTRAP must be set for a worker (clarion dev sets it for you)")
        self.settings = settings
        self.channel = channel
        self.policy = policy or RetryPolicy()
        self._own_providers = providers is None
        self._providers = providers
        self.broker = KafkaBroker(settings.kafka_bootstrap, logger=None)
        self.publisher = Publisher(settings.kafka_bootstrap)
        self.pipeline: Pipeline | None = None
        self._engine: AsyncEngine | None = None
        for lane in ("main", "bulk"):
            group = f"clarion-{channel.value}" + ("" if lane == "main" else f"-{lane}")
            self.broker.subscriber(
                topic(channel, lane),
                group_id=group,
                batch=True,
                max_records=settings.worker_batch_size,
                batch_timeout_ms=50,
                ack_policy=AckPolicy.MANUAL,
                auto_offset_reset="earliest",
            )(self._handle_batch)

    async def _handle_batch(self, msg: KafkaMessage) -> None:
        records = msg.raw_message
        if not isinstance(records, tuple):
            records = (records,)
        messages, poison = decode([r.value or b"" for r in records])
        for bad in poison:
            log.error("undecodable record sent to the DLQ: %s", bad.error)
            metrics.POISON.labels(self.channel.value).inc()
            await self.publisher.publish_raw(topic(self.channel, "dlq"), bad.raw)
        delay_s = 0.5
        while True:  # hold the batch until its outcomes are recorded; never skip it
            try:
                assert self.pipeline is not None
                await self.pipeline.deliver(messages)
                break
            except Exception as exc:
                log.warning(
                    "batch not recorded (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay_s
                )
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 10.0)
        await msg.ack()

    async def start(self) -> None:
        settings = self.settings
        self._engine = create_engine(settings.database_url, pool_size=4)
        pool = await create_pool(settings.database_url, size=settings.db_pool_size)
        if self._providers is None:
            self._providers = build_providers(settings.providers, engine=self._engine)
        steps = build_steps(settings=settings, channel=self.channel, pool=pool)
        self.pipeline = Pipeline(
            channel=self.channel,
            pool=pool,
            engine=self._engine,
            providers=self._providers,
            renderer=Renderer(),
            policy=self.policy,
            lease_s=settings.lease_s,
            concurrency=settings.worker_concurrency,
            screens=steps.screens,
            gates=steps.gates,
            unsubscribe_url=steps.unsubscribe_url,
        )
        await self.broker.start()

    async def stop(self) -> None:
        await self.broker.stop()
        await self.publisher.close()
        if self.pipeline is not None:
            await self.pipeline.pool.close()
            self.pipeline = None
        if self._own_providers and self._providers is not None:
            await self._providers.aclose()
            self._providers = None
        if self._engine is not None:
            await self._engine.dispose()
