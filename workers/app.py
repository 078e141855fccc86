"""One FastStream consumer app per channel: batch subscribers for the main and bulk lanes.

Offsets are committed (``AckPolicy.MANUAL``, one ack per batch) only after the batch's outcomes are
recorded: at-least-once from Kafka, effectively once at the provider thanks to the claim. Never
``ACK_FIRST`` (at-most-once) and never ``nack()`` (a hot redelivery loop).

Main lane first. The bulk lane has its own topic and consumer group, but the same process serves
both lanes (one event loop, DB pool, send semaphore, and the machine's CPU), so a topic of its own
is not enough: while a 500-record bulk batch was being delivered, an OTP waited behind hundreds of
bulk sends (critical p99 1.5-2 s behind a 100,000-email backlog, chaos scenario 6). So, inside the
worker (``workers.lanes.LanePriority``):

- a main-lane batch is in flight from the moment its handler gets it until its ack;
- the bulk lane delivers its batch in chunks of ``worker_bulk_chunk`` (32) and, before each
  chunk, waits until no main-lane batch is in flight. An urgent send shares the worker with at
  most the one bulk chunk already under way; with no urgent traffic, bulk runs flat out. A chunk
  waits at most ``worker_bulk_yield_max_s`` (2 s), so endless urgent traffic slows bulk down to a
  trickle instead of stopping it (and its consumer never misses ``max.poll.interval``);
- the bulk batch is still acked once, after its last chunk is recorded: chunking changes when
  bulk work runs, never what is committed. Chunks wait before they claim, so a waiting chunk
  holds no lease;
- the main lane's consumer polls with ``fetch_max_wait_ms`` = ``batch_timeout_ms`` =
  ``worker_fetch_wait_ms`` (20 ms): Tansu answers an empty fetch only when that wait runs out
  (about 140 ms at the default 500 ms), which was a floor under every urgent send's latency. The
  bulk and retry lanes keep the defaults.

The retry lane is neither held back nor holds bulk back: its notifications are already late by
design (seconds or more), and bulk retries in it are few.

Once started, the worker freezes the garbage collector's view of everything built so far
(``gc.freeze()``): a full collection over those ~200,000 long-lived objects cost ~170 ms of CPU
on this machine (0.3-1.1 s of wall time under load), stalling both lanes alike.

The retry lane and the DLQ: `workers.retry_lane`.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import logging
from typing import Any, TypeVar

from faststream import AckPolicy
from faststream.kafka import KafkaBroker
from faststream.kafka.annotations import KafkaMessage

from clarion import metrics, tracing
from clarion.kafka import Publisher
from clarion.pg import create_pool
from clarion.sandbox_store import PgSandboxStore
from clarion.settings import Settings
from core.render import Renderer
from providers.registry import ProviderSet, build_providers
from schema.enums import Channel
from schema.messages import NotificationMessage, topic
from workers.breaker import Breakers
from workers.content import Content
from workers.lanes import LanePriority
from workers.pipeline import Pipeline, decode
from workers.record import until_done
from workers.recording import Recording
from workers.retry import RetryPolicy
from workers.retry_lane import Forwarder, deliver_when_due, waiting_s
from workers.send import Sender
from workers.wiring import build_steps

log = logging.getLogger(__name__)


async def _records_as_they_are(msg: Any) -> None:
    """FastStream's decoder for the worker's subscribers: none. The handlers read the batch's records
    (``msg.raw_message``) and decode each with pydantic (``workers.pipeline.decode``), which also
    sends an undecodable one to the DLQ. FastStream's default decoder made a message object (with a
    ``uuid4``, a ``getrandom`` call) and ran ``json.loads`` for every record, and nothing read the
    result: ``bench.e2e`` A/B/B/A x2 (2026-11-28), worker CPU per notification 0.145-0.148 ->
    0.134-0.136 ms on the runs side by side (-7%)."""
    return None


T = TypeVar("T")


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
        self.policy = policy or RetryPolicy.of(settings.retry, channel)
        self.breakers = Breakers(settings.retry.breaker)
        self._own_providers = providers is None
        self._providers = providers
        self.broker = KafkaBroker(settings.kafka_bootstrap, logger=None)
        self.publisher = Publisher(settings.kafka_bootstrap)
        self.forwarder = Forwarder(publisher=self.publisher, channel=channel)
        self.pipeline: Pipeline | None = None
        self.lanes = LanePriority(
            chunk=settings.worker_bulk_chunk, max_wait_s=settings.worker_bulk_yield_max_s
        )
        self.broker.subscriber(
            topic(channel, "main"),
            group_id=f"clarion-{channel.value}",
            batch=True,
            max_records=settings.worker_batch_size,
            batch_timeout_ms=settings.worker_fetch_wait_ms,
            fetch_max_wait_ms=settings.worker_fetch_wait_ms,
            ack_policy=AckPolicy.MANUAL,
            auto_offset_reset="earliest",
            decoder=_records_as_they_are,
        )(self._handle_batch)
        self.broker.subscriber(
            topic(channel, "bulk"),
            group_id=f"clarion-{channel.value}-bulk",
            batch=True,
            max_records=settings.worker_batch_size,
            batch_timeout_ms=50,
            ack_policy=AckPolicy.MANUAL,
            auto_offset_reset="earliest",
            decoder=_records_as_they_are,
        )(self._handle_bulk_batch)
        self.retry_broker = KafkaBroker(settings.kafka_bootstrap, logger=None)
        self.retry_broker.subscriber(
            topic(channel, "retry"),
            group_id=f"clarion-{channel.value}-retry",
            batch=True,
            max_records=settings.worker_batch_size,
            batch_timeout_ms=50,
            ack_policy=AckPolicy.MANUAL,
            auto_offset_reset="earliest",
            decoder=_records_as_they_are,
        )(self._handle_retry_batch)

    async def _handle_batch(self, msg: KafkaMessage) -> None:
        async with self.lanes.urgent():
            messages = await self._decode(msg)
            await self._deliver(messages)
            await msg.ack()

    async def _handle_bulk_batch(self, msg: KafkaMessage) -> None:
        messages = await self._decode(msg)
        for chunk in self.lanes.chunks(messages):
            await self.lanes.bulk_turn()
            await self._deliver(chunk)
        await msg.ack()  # the whole batch, once every chunk is recorded

    async def _handle_retry_batch(self, msg: KafkaMessage) -> None:
        messages = await self._decode(msg)
        waits_s = await waiting_s(
            pool=self.pipeline.pool if self.pipeline is not None else None, ids=[m.id for m in messages]
        )
        await deliver_when_due(
            messages, waits_s=waits_s, hold_s=self.settings.retry.hold_max_s, deliver=self._deliver
        )
        await msg.ack()

    async def _decode(self, msg: KafkaMessage) -> list[NotificationMessage]:
        records = msg.raw_message
        if not isinstance(records, tuple):
            records = (records,)
        traceparents = [tracing.header_value(r.headers) for r in records] if tracing.enabled else None
        messages, poison = decode([r.value or b"" for r in records], traceparents)
        for bad in poison:
            log.error("undecodable record sent to the DLQ: %s", bad.error)
            metrics.POISON.labels(self.channel.value).inc()
            envelope = {
                "error": {"code": "undecodable", "message": bad.error},
                "raw_base64": base64.b64encode(bad.raw).decode(),
            }
            await self.forwarder.dead_letter(json.dumps(envelope).encode(), None)
        return messages

    async def _deliver(self, messages: list[NotificationMessage]) -> None:
        """Deliver and record ``messages``, retrying until recorded (never skip a batch), then
        forward rescheduled ones to the retry topic and dead ones to the DLQ."""
        if not messages:
            return
        assert self.pipeline is not None
        pipeline = self.pipeline
        # Hold the batch until its outcomes are recorded; never skip it. Processing is retried only
        # while it fails before any claim (database away); once provider calls were made, only the
        # recording is retried, with the same outcomes, so a database outage never sends twice.
        # Outcomes are recorded as they come, every worker_record_every_ms, so a worker killed
        # mid-batch leaves only its last moments' calls to be sent again after the lease.
        every_s = self.settings.worker_record_every_ms / 1000
        async with Recording(record=pipeline.record, every_s=every_s) as recording:
            await until_done("processed", lambda: pipeline.process(messages, done=recording.add))
        await self.forwarder.forward(messages, recording.outcomes)

    async def start(self) -> None:
        settings = self.settings
        pool = await create_pool(settings.database_url, size=settings.db_pool_size)
        if self._providers is None:
            self._providers = build_providers(
                settings.providers, sandbox_store=PgSandboxStore(settings.database_url)
            )
        steps = build_steps(settings=settings, channel=self.channel, pool=pool, providers=self._providers)
        sender = Sender(
            channel=self.channel,
            pool=pool,
            providers=self._providers,
            policy=self.policy,
            breakers=self.breakers,
            unsubscribe_url=steps.unsubscribe_url,
            on_provider_error=steps.on_provider_error,
            push_data=steps.push_data,
        )
        self.pipeline = Pipeline(
            channel=self.channel,
            pool=pool,
            content=Content(pool=pool, renderer=Renderer(), tracking=steps.email_tracking),
            sender=sender,
            policy=self.policy,
            lease_s=settings.lease_s,
            concurrency=settings.worker_concurrency,
            max_claims=settings.max_claims,
            max_deferrals=settings.max_render_deferrals,
            screens=steps.screens,
            gates=steps.gates,
        )
        await asyncio.gather(self.broker.start(), self.retry_broker.start())
        # Everything built so far (modules, pools, providers, consumers: ~200k objects) lives as
        # long as the process; frozen, a full collection no longer scans it (~170 ms of CPU each
        # time here, a stall for every lane that also tripped the renderer's 200 ms CPU budget).
        gc.freeze()

    async def stop(self) -> None:
        self.breakers.close()
        await asyncio.gather(self.broker.stop(), self.retry_broker.stop())
        await self.publisher.close()
        if self.pipeline is not None:
            await self.pipeline.pool.close()
            self.pipeline = None
        if self._own_providers and self._providers is not None:
            await self._providers.aclose()
            self._providers = None
