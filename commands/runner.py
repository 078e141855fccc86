"""Running Clarion's processes: each alone (``clarion api|worker|relay``) or all in one (``clarion dev``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from api.app import create_app
from api.read_deadline import read_deadline_protocol
from api.relay import Relay
from clarion import metrics
from clarion.broker import TansuBroker
from clarion.kafka import Publisher, create_topics
from clarion.log_maintenance import Maintainer, MaintenanceReport
from clarion.pg import asyncpg_dsn, create_pool
from clarion.settings import Settings
from clarion.tasks import running
from clarion.tenants import create_api_key, ensure_tenant
from commands.api_workers import reuse_port_socket
from core import ssrf
from core.templates import install_default_templates
from schema.db import create_engine, ensure_database, upgrade_async
from schema.enums import Channel
from workers.app import Worker
from workers.webhook_delivery import DeliverySettings, WebhookDeliverer
from workers.webhook_record import RetryPolicy

log = logging.getLogger(__name__)

DEV_TENANT = "dev"


async def prepare_database(settings: Settings) -> None:
    """Create the database if missing and migrate it to the newest schema."""
    await ensure_database(settings.database_url)
    await upgrade_async(settings.database_url, lock_timeout_s=settings.migration_lock_timeout_s)


async def ensure_dev_tenant(settings: Settings) -> str:
    """The dev tenant with every scope and the shipped templates; returns its API key."""
    engine = create_engine(settings.database_url, pool_size=1)
    try:
        async with engine.begin() as conn:
            await ensure_tenant(conn, tenant_id=DEV_TENANT, name="Development")
            await install_default_templates(conn=conn, tenant_id=DEV_TENANT)
            key = settings.dev_api_key.get_secret_value() if settings.dev_api_key else None
            return await create_api_key(
                conn, tenant_id=DEV_TENANT, name="dev", key=key or "clk_dev_" + _token()
            )
    finally:
        await engine.dispose()


def _token() -> str:
    import secrets

    return secrets.token_urlsafe(24)


def _signalled() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM, whose handlers replace the default kill from now on."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    return stopping


async def wait_for_signal() -> None:
    await _signalled().wait()


async def until_signal(run: Callable[[Callable[[], Awaitable[None]]], Awaitable[None]]) -> None:
    """Run ``run(stop)`` where ``stop()`` returns on SIGINT or SIGTERM. The handlers are installed
    before ``run`` starts anything, so a signal during start-up still ends in a clean stop (the
    part finishes starting, then stops) rather than the default kill."""
    stopping = _signalled()

    async def stop() -> None:
        await stopping.wait()

    await run(stop)


class EmbeddedServer(uvicorn.Server):
    """uvicorn inside a loop we own: our code handles the signals and tells it when to exit."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def api_server(settings: Settings, *, reuse_port: bool = False) -> EmbeddedServer:
    # One of several processes on the port (``clarion api --workers N``): each answer names the
    # process that served it, so a client or a test can tell the workers apart.
    headers = [("clarion-api-pid", str(os.getpid()))] if reuse_port else []
    config = uvicorn.Config(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,
        access_log=False,
        lifespan="on",
        http=read_deadline_protocol(
            head_timeout_s=settings.api_head_timeout_s, body_timeout_s=settings.api_body_timeout_s
        ),
        headers=headers,
    )
    return EmbeddedServer(config)


async def serve_api(
    settings: Settings,
    stop: Callable[[], Awaitable[None]],
    ready: asyncio.Event | None = None,
    *,
    reuse_port: bool = False,
) -> None:
    """Serve the API until ``stop()`` returns, then drain. ``reuse_port``: bind with ``SO_REUSEPORT``,
    as one of the processes of ``clarion api --workers N`` (``commands.api_workers``)."""
    server = api_server(settings, reuse_port=reuse_port)
    sockets = [reuse_port_socket(settings.api_host, settings.api_port)] if reuse_port else None
    serving = asyncio.create_task(server.serve(sockets=sockets))
    while not server.started and not serving.done():  # noqa: ASYNC110 - uvicorn offers only a flag
        await asyncio.sleep(0.02)
    if serving.done():
        serving.result()  # startup failed (port taken, database down): raise it
    # The app, its routes and pools live as long as the process: frozen, they are left out of
    # every full garbage collection (as in the worker; a collection over them stalls every request).
    gc.freeze()
    if ready is not None:
        ready.set()
    await stop()
    server.should_exit = True
    await serving


async def run_workers(
    settings: Settings,
    channels: list[Channel],
    stop: Callable[[], Awaitable[None]],
    ready: asyncio.Event | None = None,
) -> None:
    metrics.serve_metrics(settings.metrics_port)
    workers = [Worker(settings, ch) for ch in channels]
    await asyncio.gather(*(w.start() for w in workers))  # each consumer group join takes seconds
    if ready is not None:
        ready.set()
    try:
        await stop()
    finally:
        await asyncio.gather(*(w.stop() for w in workers))


async def run_relay(settings: Settings, stop: Callable[[], Awaitable[None]]) -> None:
    metrics.serve_metrics(settings.metrics_port)
    engine = create_engine(settings.database_url, pool_size=2)
    publisher = Publisher(settings.kafka_bootstrap or "")
    try:
        async with (
            running(log_maintainer(settings).run(), name="clarion-log-maintenance"),
            Relay.from_settings(engine, publisher, settings).running(),
        ):
            gc.freeze()  # what start-up built lives as long as the process (see serve_api)
            await stop()
    finally:
        await publisher.close()
        await engine.dispose()


def log_maintainer(settings: Settings) -> Maintainer:
    """The log's upkeep (``clarion.log_maintenance``): hourly in the relay, once in ``clarion maintain``."""
    return Maintainer(
        asyncpg_dsn(settings.database_url),
        retention_days=settings.retention_days,
        partitions_ahead=settings.partition_days_ahead,
        interval_s=settings.maintenance_interval_s,
        step_pause_s=settings.log_step_pause_s,
    )


async def maintain_once(settings: Settings) -> MaintenanceReport:
    """``clarion maintain``: one run of the log's upkeep (for cron, beside or instead of the relay's)."""
    return await log_maintainer(settings).run_once()


def delivery_settings(settings: Settings) -> DeliverySettings:
    """What ``clarion webhooks`` needs of the settings, typed."""
    return DeliverySettings(
        concurrency=settings.webhook_concurrency,
        per_tenant=min(settings.webhook_concurrency_per_tenant, settings.webhook_concurrency),
        lease_s=settings.webhook_lease_s,
        timeout_s=settings.webhook_timeout_s,
        poll_interval_s=settings.webhook_poll_interval_s,
        retention_days=settings.webhook_retention_days,
        allow=ssrf.AllowList.parse(settings.webhook_allow_hosts),
        policy=RetryPolicy(
            max_attempts=settings.webhook_max_attempts,
            base_s=settings.webhook_retry_base_s,
            max_s=settings.webhook_retry_max_s,
            disable_after_failures=settings.webhook_disable_after_failures,
            disable_after_s=settings.webhook_disable_after_s,
        ),
        breaker=settings.retry.breaker,
    )


async def run_webhooks(settings: Settings, stop: Callable[[], Awaitable[None]]) -> None:
    """Send tenants' webhook deliveries until ``stop()`` returns (``workers.webhook_delivery``)."""
    metrics.serve_metrics(settings.metrics_port)
    pool = await create_pool(settings.database_url, size=min(settings.db_pool_size, 10))
    deliverer = WebhookDeliverer(pool=pool, settings=delivery_settings(settings))
    try:
        async with running(deliverer.run()):
            gc.freeze()  # what start-up built lives as long as the process (see serve_api)
            await stop()
    finally:
        await pool.close()


@dataclass
class DevInfo:
    api_url: str
    api_key: str
    bootstrap: str


def first_send_curl(api_url: str, api_key: str) -> str:
    return (
        f"curl -s -X POST {api_url}/v1/notifications \\\n"
        f"  -H 'Authorization: Bearer {api_key}' -H 'Content-Type: application/json' \\\n"
        """  -d '{"event_id": "hello-1", "user": {"id": "u-1", "email": "ada@example.com"},"""
        """ "channel": "email", "template": "welcome", "data": {"name": "Ada"}}'"""
    )


async def dev(settings: Settings) -> None:
    """Broker (unless one is configured), migrations, topics, dev tenant, API, every worker, the relay
    and the webhook sender."""
    broker: TansuBroker | None = None
    if not settings.kafka_bootstrap:
        broker = TansuBroker()
        await asyncio.to_thread(broker.start)
        settings = settings.model_copy(update={"kafka_bootstrap": broker.bootstrap})
    try:
        await prepare_database(settings)
        await create_topics(settings.kafka_bootstrap or "", partitions=settings.topic_partitions)
        api_key = await ensure_dev_tenant(settings)
        stopped = asyncio.Event()

        async def stop() -> None:
            await stopped.wait()

        api_ready, workers_ready = asyncio.Event(), asyncio.Event()
        tasks = [
            asyncio.create_task(serve_api(settings, stop, api_ready)),
            asyncio.create_task(run_workers(settings, list(Channel), stop, workers_ready)),
            asyncio.create_task(run_relay(settings, stop)),
            asyncio.create_task(run_webhooks(settings, stop)),
        ]
        # The banner promises a working system: wait for the API to listen and every worker to
        # have joined its consumer group (or for a part to fail starting).
        readiness: asyncio.Future[Any] = asyncio.gather(api_ready.wait(), workers_ready.wait())
        pending: list[asyncio.Future[Any]] = [readiness, *tasks]
        await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                readiness.cancel()
                task.result()
        url = settings.base_url
        print(
            f"\nClarion is running (broker {settings.kafka_bootstrap}).\n"
            f"  API docs:  {url}/docs\n  Dashboard: {url}/ops  (sign in with the API key)\n"
            f"  Metrics:   {url}/metrics\n  API key:   {api_key}\n"
            f"  Sandbox:   {url}/v1/sandbox/messages\n\nSend a first notification:\n\n"
            f"{first_send_curl(url, api_key)}\n\nThen read it: curl -s -H 'Authorization: Bearer {api_key}'"
            f" {url}/v1/notifications/<id>\n\nCtrl-C stops everything.\n",
            flush=True,
        )
        waiter = asyncio.create_task(wait_for_signal())
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        stopped.set()
        for task in tasks:
            with contextlib.suppress(Exception):
                await task
        for task in done:
            if task is not waiter and task.exception():
                raise task.exception()  # type: ignore[misc]
    finally:
        if broker is not None:
            broker.stop()
        print("Clarion stopped.", flush=True)
