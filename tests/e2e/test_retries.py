"""Retries end to end over a real broker and PostgreSQL, against the local Twilio fake.

One SMS lane for the session (own database, own broker, API, worker, relay) keeps these fast; the
tests run one after another and each resets the fake's knobs. The lane's retry policy is fast:
short in-process waits, a retry schedule in seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from sqlalchemy.ext.asyncio import AsyncEngine

from api.relay import Relay
from clarion.broker import TansuBroker
from clarion.kafka import Publisher, create_topics
from clarion.retry_settings import BreakerSettings, RetrySettings
from clarion.settings import Settings
from harness.fakes.twilio import FakeTwilio
from harness.services import ApiServer, drop_database, fresh_database
from providers.registry import ProviderSet
from providers.settings import TwilioSettings
from providers.twilio import TwilioProvider
from schema.db import create_engine
from schema.enums import Channel
from tests.conftest import make_tenant
from tests.fixtures.delivery import status_of, wait_status
from tests.fixtures.sends import email_send
from workers.app import Worker

FAST_RETRIES = RetrySettings(
    in_process_attempts=3,
    base_s=0.05,
    max_wait_s=0.5,
    attempt_timeout_s=2.0,
    max_attempts=5,
    retry_base_s=1.0,
    retry_max_s=4.0,
    hold_max_s=3.0,
    breaker=BreakerSettings(enabled=False),
)


@dataclass
class Lane:
    settings: Settings
    broker: TansuBroker
    engine: AsyncEngine
    api: ApiServer
    fake: FakeTwilio
    providers: ProviderSet
    worker: Worker

    async def restart_worker(self) -> None:
        await self.worker.stop()
        self.worker = Worker(self.settings, Channel.sms, providers=self.providers)
        await self.worker.start()


@pytest.fixture(scope="session")
async def sms_lane(settings: Settings) -> AsyncIterator[Lane]:
    """An SMS worker against the Twilio fake, with the API and relay, on a database and broker of
    its own (so its failures and restarts never touch the shared stack)."""
    broker = TansuBroker()
    broker.start()
    await create_topics(broker.bootstrap, partitions=1)
    url = await fresh_database("clarion_retries")
    own = settings.model_copy(
        update={"database_url": url, "kafka_bootstrap": broker.bootstrap, "retry": FAST_RETRIES}
    )
    fake = FakeTwilio()
    await fake.start()
    twilio = TwilioSettings(
        account_sid=fake.account_sid,
        auth_token=fake.auth_token,
        from_number="+14155550199",
        base_url=fake.url,
        timeout_s=2,
    )
    providers = ProviderSet(routes={(Channel.sms, None): TwilioProvider(twilio)})
    engine = create_engine(url, pool_size=2)
    api = ApiServer(own)
    worker = Worker(own, Channel.sms, providers=providers)
    await asyncio.gather(api.start(), worker.start())
    publisher = Publisher(broker.bootstrap)
    relay = Relay(engine, publisher, interval_s=0.3, grace_s=1.0, stale_queued_s=30.0)
    relay_task = asyncio.create_task(relay.run())
    lane = Lane(own, broker, engine, api, fake, providers, worker)
    yield lane
    relay_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await relay_task
    await publisher.close()
    await lane.worker.stop()
    await providers.aclose()
    await api.stop()
    await fake.stop()
    await engine.dispose()
    broker.stop()
    await drop_database(url)


@pytest.fixture
async def lane_client(sms_lane: Lane) -> AsyncIterator[httpx.AsyncClient]:
    sms_lane.fake.reset()
    tenant = await make_tenant(sms_lane.engine)
    async with httpx.AsyncClient(
        base_url=sms_lane.api.url, headers={"Authorization": f"Bearer {tenant.key}"}, timeout=15
    ) as client:
        yield client


def sms_send(**overrides: Any) -> dict[str, Any]:
    return email_send(channel="sms", template="otp", data={"code": "424242"}, **overrides)


async def send(client: httpx.AsyncClient, **overrides: Any) -> str:
    response = await client.post("/v1/notifications", json=sms_send(**overrides))
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def request_times(fake: FakeTwilio) -> list[float]:
    return [r.at_s for r in fake.requests]


async def read_topic(bootstrap: str, topic: str, want: Any, timeout_s: float = 10) -> dict[str, Any]:
    """The first JSON record of ``topic`` (partition 0, from the start) for which ``want`` is true."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            batch = await consumer.getmany(partition, timeout_ms=200)
            for record in batch.get(partition, []):
                document = json.loads(record.value or b"null")
                if want(document):
                    return dict(document)
        raise TimeoutError(f"no matching record on {topic} within {timeout_s}s")
    finally:
        await consumer.stop()


async def test_two_server_errors_then_success_is_sent_on_the_third_attempt(
    sms_lane: Lane, lane_client: httpx.AsyncClient
) -> None:
    sms_lane.fake.force_server_error(2, status=500)
    nid = await send(lane_client)

    body = await wait_status(lane_client, nid, "sent")

    attempts = body["delivery_attempts"]
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [
        (1, "transient"),
        (2, "transient"),
        (3, "sent"),
    ]
    assert [a["http_status"] for a in attempts] == [500, 500, 201]
    assert body["attempts"] == 3 and body["provider"] == "twilio"
    assert "retrying" not in [h["status"] for h in body["history"]], "recovered within the in-process tier"


async def test_retry_after_2s_is_honoured_via_the_retry_topic(
    sms_lane: Lane, lane_client: httpx.AsyncClient
) -> None:
    # 2 s is beyond the lane's in-process cap (0.5 s): the notification is rescheduled, not held.
    sms_lane.fake.retry_after_hint = True  # not Twilio's behaviour: tests the pipeline's handling
    sms_lane.fake.force_rate_limit(1, retry_after_s=2)
    nid = await send(lane_client)

    body = await wait_status(lane_client, nid, "sent")

    first, second = request_times(sms_lane.fake)
    assert second - first >= 2.0
    assert [h["status"] for h in body["history"]].count("retrying") == 1
    assert [a["http_status"] for a in body["delivery_attempts"]] == [429, 201]
    record = await read_topic(sms_lane.broker.bootstrap, "notifications.sms.retry", lambda d: d["id"] == nid)
    assert record["channel"] == "sms"


async def test_provider_down_longer_than_in_process_attempts_is_sent_after_recovery_across_a_worker_restart(
    sms_lane: Lane, lane_client: httpx.AsyncClient
) -> None:
    # A slower schedule for the first worker, so it is stopped while the notification waits.
    pipeline = sms_lane.worker.pipeline
    assert pipeline is not None
    pipeline.policy = replace(pipeline.policy, retry_base_s=3.0)  # next try 6-12 s after the 3rd call
    sms_lane.fake.force_server_error(1000, status=503)
    nid = await send(lane_client)

    waiting = await wait_status(lane_client, nid, "retrying")
    assert waiting["attempts"] == 3
    assert waiting["error"]["code"] == "20500"
    await sms_lane.worker.stop()
    sms_lane.fake.reset()  # the provider recovers while no worker runs
    await sms_lane.restart_worker()

    body = await wait_status(lane_client, nid, "sent", 75)  # includes the restarted group join

    assert [a["outcome"] for a in body["delivery_attempts"]] == ["transient"] * 3 + ["sent"]
    assert [a["attempt"] for a in body["delivery_attempts"]] == [1, 2, 3, 4], "the schedule resumed"
    assert len(sms_lane.fake.requests) == 1


async def test_a_notification_whose_retry_would_come_after_expires_at_ends_expired(
    sms_lane: Lane, lane_client: httpx.AsyncClient
) -> None:
    # An OTP valid for 3 s; the provider asks for a pause longer than that.
    sms_lane.fake.retry_after_hint = True  # not Twilio's behaviour: tests the pipeline's handling
    sms_lane.fake.force_rate_limit(1, retry_after_s=60)
    expires_at = datetime.now(UTC) + timedelta(seconds=3)
    nid = await send(lane_client, expires_at=expires_at.isoformat())

    body = await wait_status(lane_client, nid, "expired")

    assert body["error"]["code"] == "20429"
    assert "retrying" not in [h["status"] for h in body["history"]]
    assert len(sms_lane.fake.requests) == 1


async def test_undecodable_record_goes_to_the_dlq_with_its_error_and_does_not_block_the_partition(
    sms_lane: Lane, lane_client: httpx.AsyncClient
) -> None:
    publisher = Publisher(sms_lane.broker.bootstrap)
    try:
        await publisher.publish_raw("notifications.sms", b"\x00 this is not a notification")
    finally:
        await publisher.close()
    nid = await send(lane_client)  # behind the poison record, on the same (only) partition

    await wait_status(lane_client, nid, "sent")

    dead = await read_topic(sms_lane.broker.bootstrap, "notifications.sms.dlq", lambda d: "raw_base64" in d)
    assert dead["error"]["code"] == "undecodable"
    assert "JSON" in dead["error"]["message"] or "json" in dead["error"]["message"]
    assert (await status_of(lane_client, nid))["delivery_attempts"][0]["outcome"] == "sent"
