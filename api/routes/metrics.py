"""GET /metrics (Prometheus text format) and the counter of sends the API refuses.

The API's ``/metrics`` shows this process's counters plus the queue gauges (Kafka lag per topic
and partition, waiting notifications and the oldest one's age per channel), refreshed on each
scrape. Its series name every tenant, so it answers only a scraper holding ``CLARION_METRICS_TOKEN``
(and anyone under ``clarion dev``). Workers and the relay serve their own counters on
``CLARION_METRICS_PORT``; under ``clarion dev`` everything runs in one process, so this endpoint
shows it all. Under ``clarion api --workers N`` it shows the N API processes' series together.
"""

from __future__ import annotations

import json
import os

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.auth import bearer_matches, unauthorized
from api.errors import ApiError
from api.ops import QueueMonitor
from clarion import metrics
from clarion.settings import Settings
from schema.enums import Channel

router = APIRouter(tags=["operations"])

SEND_PATHS = frozenset({"/v1/notifications", "/v1/notifications/batch"})
_BODY_PEEK_BYTES = 65536
_CHANNELS = frozenset(c.value for c in Channel)


@router.get("/metrics", include_in_schema=False)
async def prometheus_metrics(request: Request) -> Response:
    """The API's series for a scraper holding ``CLARION_METRICS_TOKEN``: they name every tenant, so
    no tenant's API key opens them. Without a token configured only ``clarion dev`` serves them."""
    settings: Settings = request.app.state.settings
    token = settings.metrics_token
    if token is None:
        if settings.env != "dev":
            raise ApiError(404, "not_found", "Set CLARION_METRICS_TOKEN to serve /metrics on the API.")
    else:
        if not bearer_matches(request, token):
            raise unauthorized("Send the metrics token as 'Authorization: Bearer <CLARION_METRICS_TOKEN>'.")
    monitor: QueueMonitor = request.app.state.queues
    await monitor.refresh_gauges()
    return Response(generate_latest(_registry()), media_type=CONTENT_TYPE_LATEST)


def _registry() -> CollectorRegistry:
    """This process's series, or under ``clarion api --workers N`` every API process's, summed
    (prometheus_client's multiprocess mode: ``clarion.metrics``)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


class RejectionCounter:
    """Counts every refused send (status >= 400 on POST /v1/notifications[/batch]) in
    ``clarion_notifications_rejected_total`` by tenant (``unauthenticated`` when the key failed),
    channel (from the body, ``unknown`` if absent or invalid) and reason (the error code)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in SEND_PATHS:
            await self.app(scope, receive, send)
            return
        request_body = bytearray()
        response_body = bytearray()
        status = 0

        async def peek_receive() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(request_body) < _BODY_PEEK_BYTES:
                request_body.extend(message.get("body", b"")[: _BODY_PEEK_BYTES - len(request_body)])
            return message

        async def peek_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and status >= 400:
                response_body.extend(message.get("body", b""))
            await send(message)

        await self.app(scope, peek_receive, peek_send)
        if status >= 400:
            principal = scope.get("state", {}).get("principal")
            tenant = principal.tenant_id if principal is not None else "unauthenticated"
            metrics.REJECTED.labels(
                tenant, _channel(bytes(request_body)), _reason(bytes(response_body))
            ).inc()


def _channel(body: bytes) -> str:
    try:
        value = json.loads(body).get("channel")
    except (ValueError, AttributeError, RecursionError):  # a refused body may nest 100,000 deep
        return "unknown"
    return value if isinstance(value, str) and value in _CHANNELS else "unknown"


def _reason(body: bytes) -> str:
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return "unknown"
    return code if isinstance(code, str) and len(code) <= 64 else "unknown"
