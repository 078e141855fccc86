"""The worker's spans continue the trace a message's ``traceparent`` header names: one claim span per
notification, and under it the render, every provider call (provider, HTTP status, attempt) and the
record. The claim, address lookup and record (database statements) are replaced by what the test
gives; the render, retries and provider calls are the pipeline's own. The run over the real API,
broker and worker processes is tests/e2e/test_traces.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from uuid import UUID

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from core.render import Renderer
from providers.base import RenderedMessage, SendResult
from providers.errors import TransientProviderError
from providers.registry import ProviderSet
from schema.enums import Channel, Status
from schema.messages import NotificationMessage
from tests.fixtures.claimed import claimed
from tests.fixtures.spans import VALID, in_memory_traces, named
from workers import pipeline as pipeline_module
from workers.claim import ClaimedNotification, Unreadable
from workers.content import Content
from workers.outcome import Outcome
from workers.pipeline import Pipeline, decode
from workers.recipients import Address
from workers.retry import RetryPolicy
from workers.send import Sender


class FlakyOnce:
    """Answers 503 to the first call of each message, then accepts it with 202."""

    name = "flaky"

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    async def send(self, message: RenderedMessage) -> SendResult:
        self.calls[message.to] = self.calls.get(message.to, 0) + 1
        if self.calls[message.to] == 1:
            raise TransientProviderError("busy", provider=self.name, code="unavailable", http_status=503)
        return SendResult(self.name, f"m-{message.to}", http_status=202)

    async def aclose(self) -> None:
        return None


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with in_memory_traces() as exporter:
        yield exporter


def pipeline_for(monkeypatch: pytest.MonkeyPatch, rows: list[ClaimedNotification]) -> Pipeline:
    async def claim(**kwargs: Any) -> tuple[list[ClaimedNotification], list[Unreadable]]:
        return [r for r in rows if r.id in kwargs["ids"]], []

    async def addresses_for(**kwargs: Any) -> dict[UUID, list[Address]]:
        return {r.id: [Address(to=f"+1415555{i:04d}")] for i, r in enumerate(kwargs["rows"])}

    async def record(**_: Any) -> None:
        return None

    monkeypatch.setattr(pipeline_module, "claim", claim)
    monkeypatch.setattr(pipeline_module, "addresses_for", addresses_for)
    monkeypatch.setattr(pipeline_module, "record", record)
    sender = Sender(
        channel=Channel.sms,
        pool=None,  # type: ignore[arg-type]
        providers=ProviderSet(routes={(Channel.sms, None): FlakyOnce()}),
        policy=RetryPolicy(base_s=0.001),
    )
    return Pipeline(
        channel=Channel.sms,
        pool=None,  # type: ignore[arg-type]
        content=Content(pool=None, renderer=Renderer()),  # type: ignore[arg-type]
        sender=sender,
        policy=RetryPolicy(base_s=0.001),
        lease_s=30.0,
        concurrency=4,
    )


def message(row: ClaimedNotification) -> NotificationMessage:
    return NotificationMessage(id=row.id, tenant_id="t1", channel=Channel.sms, user_id=row.user_id)


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def deliver(pipeline: Pipeline, messages: list[NotificationMessage]) -> list[Outcome]:
    outcomes = await pipeline.process(messages)
    await pipeline.record(outcomes)
    return outcomes


async def test_a_delivery_is_one_subtree_under_the_messages_traceparent(
    monkeypatch: pytest.MonkeyPatch, spans: InMemorySpanExporter
) -> None:
    row = claimed()
    [m], poison = decode([message(row).model_dump_json().encode()], [VALID])
    assert not poison and m.traceparent == VALID
    pipeline = pipeline_for(monkeypatch, [row])
    [outcome] = await deliver(pipeline, [m])
    assert outcome.status is Status.sent
    assert pipeline._traces == {}  # handed to the record span, nothing kept

    [claim] = named(spans, "clarion.claim")
    [render] = named(spans, "clarion.render")
    calls = sorted(named(spans, "clarion.provider.send"), key=lambda s: s.start_time or 0)
    [record] = named(spans, "clarion.record")
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {int(VALID.split("-")[1], 16)}
    assert parent_of(claim) == int(VALID.split("-")[2], 16)
    assert claim.kind is SpanKind.CONSUMER
    assert claim.attributes is not None and claim.attributes["clarion.claimed"] is True
    for child in (render, *calls, record):
        assert parent_of(child) == claim.context.span_id, child.name
    assert [(c.attributes or {}).get("clarion.attempt") for c in calls] == [1, 2]
    assert [(c.attributes or {}).get("http.response.status_code") for c in calls] == [503, 202]
    assert {(c.attributes or {}).get("clarion.provider") for c in calls} == {"flaky"}
    assert [c.status.status_code for c in calls] == [StatusCode.ERROR, StatusCode.UNSET]
    assert calls[0].attributes is not None and calls[0].attributes["error.type"] == "unavailable"
    assert all(c.kind is SpanKind.CLIENT for c in calls)
    assert record.attributes is not None and record.attributes["clarion.status"] == "sent"


async def test_each_notification_of_a_batch_continues_its_own_trace(
    monkeypatch: pytest.MonkeyPatch, spans: InMemorySpanExporter
) -> None:
    rows = [claimed(), claimed()]
    parents = [
        "00-11111111111111111111111111111111-1111111111111111-01",
        "00-22222222222222222222222222222222-2222222222222222-01",
    ]
    messages = [message(r).model_copy(update={"traceparent": p}) for r, p in zip(rows, parents, strict=True)]
    await deliver(pipeline_for(monkeypatch, rows), messages)
    by_trace: dict[int, set[str]] = {}
    for s in spans.get_finished_spans():
        by_trace.setdefault(s.context.trace_id, set()).add(s.name)
    expected = {"clarion.claim", "clarion.render", "clarion.provider.send", "clarion.record"}
    assert by_trace == {
        0x11111111111111111111111111111111: expected,
        0x22222222222222222222222222222222: expected,
    }


async def test_a_message_without_or_with_a_hostile_traceparent_gets_a_trace_of_its_own(
    monkeypatch: pytest.MonkeyPatch, spans: InMemorySpanExporter
) -> None:
    rows = [claimed(), claimed()]
    messages = [message(rows[0]), message(rows[1]).model_copy(update={"traceparent": "ff-garbage"})]
    outcomes = await deliver(pipeline_for(monkeypatch, rows), messages)
    assert [o.status for o in outcomes] == [Status.sent, Status.sent]
    claims = named(spans, "clarion.claim")
    assert len(claims) == 2 and all(c.parent is None for c in claims)
    assert len({c.context.trace_id for c in claims}) == 2


async def test_a_message_claimed_elsewhere_has_a_claim_span_and_nothing_under_it(
    monkeypatch: pytest.MonkeyPatch, spans: InMemorySpanExporter
) -> None:
    row = claimed()
    pipeline = pipeline_for(monkeypatch, [])  # the claim finds it sent or leased elsewhere
    assert await deliver(pipeline, [message(row).model_copy(update={"traceparent": VALID})]) == []
    [claim] = spans.get_finished_spans()
    assert claim.name == "clarion.claim"
    assert claim.attributes is not None and claim.attributes["clarion.claimed"] is False


async def test_with_tracing_off_the_worker_makes_no_span_and_keeps_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    row = claimed()
    [m], _ = decode([message(row).model_dump_json().encode()])
    pipeline = pipeline_for(monkeypatch, [row])
    [outcome] = await deliver(pipeline, [m.model_copy(update={"traceparent": VALID})])
    assert outcome.status is Status.sent
    assert pipeline._traces == {}
