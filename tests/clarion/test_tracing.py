"""``clarion.tracing``: when it turns on, which traceparents it trusts, and the spans it makes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from clarion import tracing
from tests.fixtures.spans import HOSTILE, VALID, in_memory_traces, named, traceparent


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    with in_memory_traces() as exporter:
        yield exporter


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SDK_DISABLED": "TRUE", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_TRACES_EXPORTER": "otlp"}, True),
    ],
)
def test_traces_are_on_only_when_an_exporter_is_asked_for(environ: dict[str, str], on: bool) -> None:
    assert tracing.wanted(environ) is on


def test_off_by_default_and_configure_without_otel_env_leaves_it_off() -> None:
    assert tracing.enabled is False
    assert tracing.configure(service="clarion-test", environ={}) is False
    assert tracing.enabled is False


def test_configure_turns_on_with_the_service_name_and_shutdown_turns_off() -> None:
    try:
        assert tracing.configure(service="clarion-test", environ={"OTEL_TRACES_EXPORTER": "console"})
        assert tracing.enabled is True
    finally:
        tracing.shutdown()
    assert tracing.enabled is False


def test_an_unknown_exporter_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="zipkin"):
        tracing.configure(service="clarion-test", environ={"OTEL_TRACES_EXPORTER": "zipkin"})
    assert tracing.enabled is False


def test_a_valid_traceparent_is_continued(spans: InMemorySpanExporter) -> None:
    with tracing.span("clarion.accept", parent=VALID, kind="server") as span:
        span.set("clarion.channel", "email")
        ours = span.traceparent
    [done] = spans.get_finished_spans()
    assert done.kind is SpanKind.SERVER
    assert f"{done.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert done.parent is not None and f"{done.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert done.parent.is_remote
    assert done.attributes == {"clarion.channel": "email"}
    assert ours == traceparent(done)


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_hostile_traceparent_starts_a_new_trace(spans: InMemorySpanExporter, hostile: str) -> None:
    assert tracing.parent_context(hostile) is None
    with tracing.span("clarion.accept", parent=hostile, kind="server"):
        pass
    [done] = spans.get_finished_spans()
    assert done.parent is None
    assert f"{done.context.trace_id:032x}" != "4bf92f3577b34da6a3ce929d0e0e4736"


def test_children_in_another_process_continue_from_the_traceparent(spans: InMemorySpanExporter) -> None:
    with tracing.span("clarion.accept", parent=None, kind="server") as accept:
        stored = accept.traceparent
    claim = tracing.emit("clarion.claim", parent=stored, start_ns=1_000, end_ns=2_000, kind="consumer")
    tracing.emit(
        "clarion.provider.send",
        parent=claim,
        start_ns=1_200,
        end_ns=1_900,
        kind="client",
        attributes={"clarion.provider": "sandbox", "http.response.status_code": 503, "clarion.attempt": 1},
        error_type="unavailable",
    )
    [root] = named(spans, "clarion.accept")
    [claimed] = named(spans, "clarion.claim")
    [call] = named(spans, "clarion.provider.send")
    assert {s.context.trace_id for s in spans.get_finished_spans()} == {root.context.trace_id}
    assert root.parent is None
    assert claimed.parent is not None and claimed.parent.span_id == root.context.span_id
    assert call.parent is not None and call.parent.span_id == claimed.context.span_id
    assert (claimed.start_time, claimed.end_time) == (1_000, 2_000)
    assert call.status.status_code is StatusCode.ERROR
    assert call.attributes is not None and call.attributes["error.type"] == "unavailable"
    assert call.attributes["http.response.status_code"] == 503


def test_an_exception_marks_the_span_failed_with_its_class_only(spans: InMemorySpanExporter) -> None:
    with pytest.raises(KeyError), tracing.span("clarion.render", parent=None):
        raise KeyError("a tenant's secret value")
    [done] = spans.get_finished_spans()
    assert done.status.status_code is StatusCode.ERROR
    assert done.attributes == {"error.type": "KeyError"}
    assert not done.events  # no exception event: its text could quote tenant data


@pytest.mark.parametrize(
    ("headers", "found"),
    [
        ([("traceparent", VALID.encode())], VALID),
        ((("other", b"x"), ("traceparent", VALID.encode())), VALID),
        ([("traceparent", b"x" * 10_000)], None),
        ([], None),
        (None, None),
    ],
)
def test_the_kafka_header_is_read_only_when_it_can_be_a_traceparent(
    headers: object, found: str | None
) -> None:
    assert tracing.header_value(headers) == found
