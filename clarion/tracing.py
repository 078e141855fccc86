"""OpenTelemetry traces: one trace per notification, from its accept at the API to its record.

::

    clarion.accept             API, SERVER: child of the request's W3C ``traceparent`` when it is
     |                         valid, else a new trace; its own traceparent is stored with the
     |                         notification and travels in the Kafka record's ``traceparent`` header
     +- clarion.claim          worker, CONSUMER: one per notification of the claimed batch
         +- clarion.render
         +- clarion.provider.send   one per provider call: provider, HTTP status, attempt number
         +- clarion.record

Off by default. :func:`configure` turns it on in a process when ``OTEL_SDK_DISABLED`` is not
``true`` and an exporter is asked for: ``OTEL_TRACES_EXPORTER`` (``otlp`` or ``console``; ``none``
keeps it off) or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` /
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``). The exporter is OTLP over HTTP/protobuf; every other
``OTEL_*`` variable (service name, resource attributes, sampler, batch processor) means what the
OpenTelemetry SDK says it means.

Off, the callers test :data:`enabled` (a module attribute) before anything else: no span, no
header parsing, no column value; ``bench/tracing.py`` measures what remains. Parents and children
are passed between steps as traceparent strings (``str | None``), so nothing below this module
knows OpenTelemetry.

A ``traceparent`` is tenant-supplied input: anything that is not a valid W3C traceparent (garbage,
a 10 KB value, version ``ff``, all-zero ids) is ignored and the accept starts a new trace.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Literal

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:  # the SDK is imported only when tracing turns on (~40 ms of start-up)
    from opentelemetry.sdk.trace import TracerProvider

Kind = Literal["server", "consumer", "client", "internal"]
Value = str | int | bool

enabled: bool = False
"""Whether this process traces. Callers check it first, so tracing off costs one attribute read."""

HEADER = "traceparent"
MAX_TRACEPARENT = 55  # version 00 is exactly 55 characters; a longer value is refused unread
_KINDS = {
    "server": SpanKind.SERVER,
    "consumer": SpanKind.CONSUMER,
    "client": SpanKind.CLIENT,
    "internal": SpanKind.INTERNAL,
}
_propagator = TraceContextTextMapPropagator()
_tracer: trace.Tracer | None = None
_provider: TracerProvider | None = None


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` asks for traces (see the module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(*, service: str, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on for this process when the environment asks for it; returns whether it did.

    ``service`` names the process (``service.name``) unless ``OTEL_SERVICE_NAME`` is set. Raises
    ``ValueError`` for an exporter other than ``otlp`` or ``console``."""
    environ = os.environ if environ is None else environ
    if not wanted(environ):
        return False
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    name = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() or "otlp"
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    elif name == "console":
        exporter = ConsoleSpanExporter()
    else:
        raise ValueError(f"OTEL_TRACES_EXPORTER={name!r}: Clarion exports traces with 'otlp' or 'console'")
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    use(provider)
    return True


def use(provider: TracerProvider) -> None:
    """Trace through ``provider`` from now on (``configure`` calls it; tests pass one whose
    processor exports to memory)."""
    global enabled, _tracer, _provider
    _provider = provider
    _tracer = provider.get_tracer("clarion")
    enabled = True


def shutdown() -> None:
    """Export what is buffered and turn tracing off."""
    global enabled, _tracer, _provider
    provider, _provider, _tracer, enabled = _provider, None, None, False
    if provider is not None:
        provider.shutdown()


def parent_context(traceparent: str | None) -> Context | None:
    """The context a valid W3C ``traceparent`` names, or None (absent, too long, malformed, a
    version this code does not read, or all-zero ids)."""
    if not traceparent or len(traceparent) > MAX_TRACEPARENT:
        return None
    context = _propagator.extract({HEADER: traceparent})
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def traceparent_of(span: Span) -> str:
    """The W3C traceparent naming ``span`` (what a child in another process continues from)."""
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


class SpanRef:
    """A span being timed: its traceparent (for children elsewhere) and attributes to add."""

    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    @property
    def traceparent(self) -> str:
        return traceparent_of(self._span)

    def set(self, key: str, value: Value) -> None:
        self._span.set_attribute(key, value)

    def fail(self, error_type: str) -> None:
        """Mark the span failed with the error's type (never its text: it may quote tenant data)."""
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(Status(StatusCode.ERROR))


@contextmanager
def span(
    name: str, *, parent: str | None, kind: Kind = "internal", attributes: Mapping[str, Value] | None = None
) -> Iterator[SpanRef]:
    """A span around the block, a child of ``parent`` (a traceparent; None or invalid: a new
    trace). An exception leaving the block marks it failed with the exception's class. Only call
    it when :data:`enabled`."""
    assert _tracer is not None, "tracing.span called while tracing is off"
    started = _tracer.start_span(
        name, context=parent_context(parent), kind=_KINDS[kind], attributes=attributes
    )
    ref = SpanRef(started)
    try:
        yield ref
    except BaseException as exc:
        ref.fail(type(exc).__name__)
        raise
    finally:
        started.end()


def emit(
    name: str,
    *,
    parent: str | None,
    start_ns: int,
    end_ns: int,
    kind: Kind = "internal",
    attributes: Mapping[str, Value] | None = None,
    error_type: str | None = None,
) -> str:
    """Record a span that already happened (batch steps time themselves once for many
    notifications); returns its traceparent. Only call it when :data:`enabled`."""
    assert _tracer is not None, "tracing.emit called while tracing is off"
    done = _tracer.start_span(
        name, context=parent_context(parent), kind=_KINDS[kind], attributes=attributes, start_time=start_ns
    )
    if error_type is not None:
        SpanRef(done).fail(error_type)
    done.end(end_time=end_ns)
    return traceparent_of(done)


def header_value(headers: object) -> str | None:
    """The ``traceparent`` of a Kafka record's headers (a sequence of ``(name, bytes)``), or None."""
    if not isinstance(headers, (list, tuple)):
        return None
    for key, value in headers:
        if key == HEADER and isinstance(value, bytes) and len(value) <= MAX_TRACEPARENT:
            return value.decode("ascii", "replace")
    return None
