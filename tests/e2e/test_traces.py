"""One trace across the real processes: ``clarion api`` accepts a send carrying a ``traceparent``,
Kafka carries it in the record header, ``clarion worker email`` continues it, and both export over
OTLP/HTTP (configured only by ``OTEL_*`` variables) to a receiver this test runs."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from clarion.broker import TansuBroker
from clarion.kafka import create_topics
from clarion.ports import free_port
from clarion.settings import Settings
from harness.services import ClarionProcess, drop_database, fresh_database, wait_until
from tests.conftest import make_tenant
from tests.fixtures.delivery import wait_status
from tests.fixtures.otlp import OtlpReceiver, ReceivedSpan, otlp_receiver
from tests.fixtures.sends import email_send
from tests.fixtures.spans import VALID

WORKER_SPANS = ("clarion.claim", "clarion.render", "clarion.provider.send", "clarion.record")


@pytest.fixture
async def isolated(settings: Settings) -> AsyncIterator[Settings]:
    """A broker and database of this test's own: its processes export every span they make."""
    broker = TansuBroker()
    broker.start()
    await create_topics(broker.bootstrap, partitions=1)
    url = await fresh_database("clarion_traces")
    yield settings.model_copy(
        update={"database_url": url, "kafka_bootstrap": broker.bootstrap, "api_port": free_port()}
    )
    await drop_database(url)
    broker.stop()


def one_trace(receiver: OtlpReceiver, trace_id: str) -> dict[str, list[ReceivedSpan]] | None:
    """The trace's spans by name, once the accept and every worker step have arrived."""
    by_name: dict[str, list[ReceivedSpan]] = {}
    for s in receiver.spans:
        if s.trace_id == trace_id:
            by_name.setdefault(s.name, []).append(s)
    return by_name if all(n in by_name for n in ("clarion.accept", *WORKER_SPANS)) else None


async def test_one_trace_from_the_api_through_kafka_to_the_worker(isolated: Settings) -> None:
    engine = create_async_engine(isolated.database_url)
    tenant = await make_tenant(engine)
    await engine.dispose()
    with otlp_receiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        api = ClarionProcess(isolated, "api", extra_env=env)
        worker = ClarionProcess(isolated, "worker", "email", extra_env=env)
        api.start()
        worker.start()
        try:
            base = f"http://127.0.0.1:{isolated.api_port}"
            async with httpx.AsyncClient(
                base_url=base, headers={"Authorization": f"Bearer {tenant.key}"}, timeout=20
            ) as client:

                async def api_up() -> bool:
                    try:
                        return (await client.get("/healthz")).status_code == 200
                    except httpx.TransportError:
                        return False

                await wait_until(api_up, timeout_s=60)
                sent = await client.post(
                    "/v1/notifications", json=email_send(), headers={"traceparent": VALID}
                )
                assert sent.status_code == 202, sent.text
                nid = sent.json()["id"]
                await wait_status(client, nid, "sent", 90)
            trace_id, caller_span = VALID.split("-")[1:3]
            spans = await wait_until(lambda: one_trace(receiver, trace_id), timeout_s=30)
        finally:
            assert api.stop() == 0
            assert worker.stop() == 0

    [accept] = spans["clarion.accept"]
    [claim] = spans["clarion.claim"]
    [render] = spans["clarion.render"]
    [call] = spans["clarion.provider.send"]
    [record] = spans["clarion.record"]
    assert accept.service == "clarion-api" and accept.parent_span_id == caller_span
    assert accept.attributes["clarion.notification_id"] == nid
    assert accept.attributes["http.response.status_code"] == 202
    assert {s.service for s in (claim, render, call, record)} == {"clarion-worker-email"}
    assert claim.parent_span_id == accept.span_id
    assert claim.attributes["clarion.notification_id"] == nid
    for child in (render, call, record):
        assert child.parent_span_id == claim.span_id, child.name
    assert call.attributes["clarion.provider"] == "sandbox"
    assert call.attributes["clarion.attempt"] == 1
    assert call.attributes["clarion.outcome"] == "sent"
    assert record.attributes["clarion.status"] == "sent"
