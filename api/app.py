"""The API application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from api.accept_queue import AcceptQueue
from api.accepted_counts import AcceptedCounts
from api.allow import MethodCheck
from api.auth import KeyCache
from api.callback_gate import CallbackGate
from api.engagement_gate import EngagementGate
from api.engagement_models import DeviceEngagementIn, EngagementIn
from api.errors import BodySizeLimit, install_error_handlers
from api.fast_route import FastRoute
from api.ingress import IngressLimits, RateLimitHeaders
from api.models import BatchIn, NotificationIn
from api.openapi_doc import document as document_errors
from api.ops import QueueMonitor
from api.outbox import Outbox
from api.preference_gate import PreferenceGate, keyed_gate
from api.routes import analytics as analytics_routes
from api.routes import categories, health, notifications, preferences, sandbox, templates, users
from api.routes import dlq as dlq_routes
from api.routes import docs as docs_routes
from api.routes import engagement as engagement_routes
from api.routes import keys as key_routes
from api.routes import metrics as metrics_routes
from api.routes import ops as ops_routes
from api.routes import rate_limits as rate_limit_routes
from api.routes import search as search_routes
from api.routes import tracking as tracking_routes
from api.routes import webhook_endpoints as webhook_endpoint_routes
from api.routes import webhooks as webhook_routes
from api.search_limit import SearchLimit
from api.token_first import TokenFirst
from clarion.kafka import Publisher
from clarion.pg import create_pool
from clarion.settings import Settings
from core.render import Renderer
from schema.db import create_engine


def create_app(settings: Settings) -> FastAPI:
    """Build the API. The DB engine, Kafka publisher and outbox live for the app's lifespan."""
    if not settings.kafka_bootstrap:
        raise ValueError("CLARION_KAFKA_BOOTSTRAP must be set for the API (clarion dev sets it for you)")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_engine(settings.database_url, pool_size=settings.db_pool_size)
        pool = await create_pool(settings.database_url, size=settings.db_pool_size)
        publisher = Publisher(settings.kafka_bootstrap or "")
        # A row no worker has taken is marked well inside the relay's grace (api/outbox.py).
        outbox = Outbox(pool, publisher, mark_after_s=settings.relay_grace_s / 3)
        app.state.settings = settings
        app.state.engine = engine
        app.state.pool = pool
        app.state.publisher = publisher
        app.state.outbox = outbox
        app.state.renderer = Renderer()
        app.state.accepted_counts = AcceptedCounts(pool=pool)
        app.state.accepts = AcceptQueue(
            pool=pool, renderer=app.state.renderer, counts=app.state.accepted_counts
        )
        app.state.key_cache = KeyCache()
        app.state.ingress = IngressLimits.build(settings=settings, pool=pool)
        app.state.readiness = health.Readiness()
        app.state.searches = SearchLimit(
            per_tenant=settings.search_concurrency_per_tenant, timeout_s=settings.search_timeout_s
        )
        app.state.engagement_gate = EngagementGate(pool_size=settings.db_pool_size)
        app.state.callback_gate = CallbackGate.build(pool_size=settings.db_pool_size)
        app.state.preference_gate = PreferenceGate(pool_size=settings.db_pool_size)
        app.state.keyed_preference_gate = keyed_gate(
            pool_size=settings.db_pool_size, per_tenant=settings.preference_requests_per_tenant
        )
        app.state.queues = QueueMonitor(
            engine=engine, bootstrap=settings.kafka_bootstrap or "", retention_days=settings.retention_days
        )
        await outbox.start()
        app.state.accepted_counts.start()
        if settings.render_box_at_start:
            await app.state.renderer.start_box()
        try:
            yield
        finally:
            await outbox.stop()
            await app.state.accepted_counts.aclose()
            await app.state.renderer.aclose()
            await app.state.ingress.aclose()
            await app.state.queues.close()
            await publisher.close()
            await pool.close()
            await engine.dispose()

    app = FastAPI(
        title="Clarion",
        version="0.1.0",
        lifespan=lifespan,
        description="Notification delivery: push, SMS and email, never lost, never sent twice.",
        # Served by api.routes.docs from packaged assets: FastAPI's own pages load them from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    routers = [
        health.router,
        docs_routes.docs_router(app),
        notifications.router,
        dlq_routes.router,
        users.router,
        preferences.router,
        categories.router,
        templates.router,
        search_routes.router,
        ops_routes.router,
        metrics_routes.router,
        rate_limit_routes.router,
        webhook_routes.router,
        engagement_routes.router,
        tracking_routes.router,
        analytics_routes.router,
        webhook_endpoint_routes.router,
        key_routes.router,
    ]
    if settings.sandbox_enabled:
        routers.append(sandbox.router)
    for router in routers:  # in this order: it is the order of the OpenAPI document's paths
        app.include_router(router)
    # Around the router only (the hot route below never reaches it): 405 with the path's every method.
    app.add_middleware(MethodCheck, routes=app.router.routes)
    # Beside the hot route: a user-side request with a forged token is refused before the router.
    app.add_middleware(
        TokenFirst, settings=settings, routes=preferences.USER_SIDE, page=preferences.error_page
    )
    # Innermost but one of the middlewares, so the size limit, rate-limit headers and rejection counter
    # below still wrap the hot route.
    app.add_middleware(
        FastRoute,
        method="POST",
        path="/v1/notifications",
        endpoint=notifications.send,
        handlers=app.exception_handlers,
    )
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_body_bytes,
        per_path={
            "/v1/notifications/batch": settings.max_batch_body_bytes,
            webhook_routes.SENDGRID_EVENTS_PATH: webhook_routes.SENDGRID_EVENTS_MAX_BODY_BYTES,
        },
    )
    _document_bodies(app, NotificationIn, BatchIn, EngagementIn, DeviceEngagementIn)
    app.add_middleware(RateLimitHeaders)
    app.add_middleware(metrics_routes.RejectionCounter)
    return app


def _document_bodies(app: FastAPI, *models: type[BaseModel]) -> None:
    """Add request bodies that routes validate themselves (``parse_body``) to the OpenAPI components,
    and every operation's error answers and security (``api.openapi_doc``)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            # Nested models keep a prefix of their own: another route's body may share a name
            # (api.users.DeviceIn beside api.models.DeviceIn).
            prefix = model.__module__.replace(".", "__") + "__"
            document = model.model_json_schema(ref_template=f"#/components/schemas/{prefix}{{model}}")
            components.update({prefix + name: d for name, d in document.pop("$defs", {}).items()})
            components[model.__name__] = document
        app.openapi_schema = document_errors(app, schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
