"""What tracing costs: the accept path's CPU per send with tracing off and on, and the worker's
spans per notification. Run with ``python -m bench.tracing [--sends N]``.

The accept path here is ``POST /v1/notifications``'s own handler (``api.routes.notifications.send``):
the body parsed and validated, the submission hashed, metrics, the response built; with tracing on,
also the ``clarion.accept`` span (the caller's ``traceparent`` continued) and its attributes. What
waits on the network is left out, so the tracing share shows: authentication (the key cache) and
ingress rules are stubbed, and the group commit answers at once (in the real path the traceparent
is one more text column in the same ``INSERT``). "Off" is the shipped default; "before" calls the
handler body directly, as the route did before tracing existed. "On" exports through the SDK's
batch processor to an exporter that drops the spans (the OTLP encoding and HTTP post happen on
the processor's thread, off the request).
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from starlette.requests import Request

from api.routes import notifications as route
from api.submission import AcceptResult, Submission
from clarion import tracing
from clarion.tenants import Principal
from schema.enums import Channel, Priority
from schema.messages import NotificationMessage
from workers.outcome import Attempt, Outcome
from workers.traces import claim_spans, provider_spans, record_spans

TRACEPARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
BODY = (
    b'{"event_id": "evt-1", "user": {"id": "u-1", "email": "ada@example.com"}, "channel": "email",'
    b' "template": "order_shipped", "data": {"order_id": "123", "name": "Ada"}}'
)
PRINCIPAL = Principal(tenant_id="bench", key_id="k", scopes=frozenset({"send"}))
ROUNDS = 5


class Dropping(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


class Accepts:
    async def accept(self, send: Submission) -> AcceptResult:
        message = NotificationMessage(
            id=uuid.uuid4(), tenant_id="bench", channel=Channel.email, user_id=uuid.uuid4(),
            traceparent=send.traceparent,
        )  # fmt: skip
        return AcceptResult(message.id, "accepted", False, message)


def stub_network() -> None:
    async def authorize(request: Request, scope: str) -> Principal:
        return PRINCIPAL

    async def enforce_ingress(**_: Any) -> None:
        return None

    route.authorize = authorize  # type: ignore[assignment]
    route.enforce_ingress = enforce_ingress  # type: ignore[assignment]


def request(app: Any) -> Request:
    scope = {
        "type": "http", "method": "POST", "path": "/v1/notifications", "app": app, "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"traceparent", TRACEPARENT)],
    }  # fmt: skip
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        sent = True
        return {"type": "http.request", "body": BODY, "more_body": False}

    return Request(scope, receive)


async def per_send_us(handler: Callable[[Request], Awaitable[Any]], app: Any, sends: int) -> float:
    """Mean µs per send of ``handler`` over ``sends`` sends."""
    started = time.perf_counter()
    for _ in range(sends):
        await handler(request(app))
    return (time.perf_counter() - started) / sends * 1e6


def worker_spans_us(notifications: int) -> float:
    """µs per notification for its claim, provider-call and record spans (one call each)."""
    messages = [
        NotificationMessage(
            id=uuid.uuid4(), tenant_id="bench", channel=Channel.email, user_id=uuid.uuid4(),
            priority=Priority.normal, traceparent=TRACEPARENT.decode(),
        )
        for _ in range(notifications)
    ]  # fmt: skip
    now = time.time_ns()
    at = datetime.now(UTC)
    started = time.perf_counter()
    parents = claim_spans(messages, {m.id for m in messages}, start_ns=now, end_ns=now + 1000)
    for m in messages:
        provider_spans(parents[m.id], [
            Attempt(notification_id=m.id, attempt=1, provider="sandbox", recipient=None, started_at=at,
                    finished_at=at, outcome="sent", http_status=202),
        ])  # fmt: skip
    outcomes = [Outcome(notification_id=m.id, status="sent") for m in messages]  # type: ignore[arg-type]
    record_spans(parents, outcomes, start_ns=now, end_ns=now + 1000)
    return (time.perf_counter() - started) / notifications * 1e6


async def main(sends: int) -> None:
    stub_network()
    app = SimpleNamespace(
        state=SimpleNamespace(accepts=Accepts(), outbox=SimpleNamespace(submit=lambda m: True))
    )

    async def before(req: Request) -> Any:
        return await route._send(req, None)

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Dropping(), max_queue_size=sends * 2))
    tracing.use(provider)
    worker = min(worker_spans_us(sends // 10) for _ in range(ROUNDS))
    times: dict[str, list[float]] = {"before": [], "off": [], "on": []}
    try:
        # Interleaved rounds, each variant's best kept: the machine is shared, and noise only adds.
        for _ in range(ROUNDS + 1):
            tracing.enabled = False
            times["before"].append(await per_send_us(before, app, sends))
            times["off"].append(await per_send_us(route.send, app, sends))
            tracing.enabled = True
            times["on"].append(await per_send_us(route.send, app, sends))
    finally:
        tracing.shutdown()
    base, off, on = (min(times[k][1:]) for k in ("before", "off", "on"))  # the first round warms up
    print(f"accept handler, best of {ROUNDS} interleaved rounds of {sends} sends:")
    print(f"  before tracing existed  {base:7.2f} µs/send")
    print(
        f"  tracing off (default)   {off:7.2f} µs/send  ({off - base:+.2f} µs, {(off / base - 1) * 100:+.1f}%)"
    )
    print(
        f"  tracing on              {on:7.2f} µs/send  ({on - base:+.2f} µs, {(on / base - 1) * 100:+.1f}%)"
    )
    print(f"worker spans when on: {worker:.1f} µs per notification (claim + provider call + record)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sends", type=int, default=20_000)
    asyncio.run(main(parser.parse_args().sends))
