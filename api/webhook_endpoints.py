"""A tenant's outbound webhook endpoints: register (the secret is shown once), list, change,
rotate the secret, delete.

Every URL passes ``core.ssrf`` here (shape, then every resolved address public unless the operator
allow-list names it) and again at every send. A tenant sees only its own endpoints: another
tenant's id is simply not found. A disabled endpoint's pending deliveries are parked; enabling it
(also one Clarion disabled: that clears the reason and the failure streak) resumes them.

Errors: ``ApiError`` 422 ``url_invalid`` / ``url_unresolvable`` / ``url_not_allowed``, 409
``limit_reached`` (``CLARION_MAX_WEBHOOK_ENDPOINTS_PER_TENANT``), 409 ``endpoint_busy`` (a disable,
enable or delete while a replay of the endpoint is being queued), 404 ``not_found``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from uuid import UUID

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.caps import hold_under_cap
from api.errors import ApiError
from api.webhook_replay import hold_replays
from core import ssrf
from core.dns import Resolver
from core.webhook_events import EVENT_TYPES, LOCK_ENDPOINT, PARK_PENDING, UNPARK_PENDING
from core.webhook_signing import new_secret
from schema.ids import uuid7
from schema.webhook_models import WebhookEndpoint

_endpoints = WebhookEndpoint.__table__  # type: ignore[attr-defined]
EventType = Literal[EVENT_TYPES]  # type: ignore[valid-type]
URL_PATTERN = r"^[Hh][Tt][Tt][Pp][Ss]?://"
ROTATION_OVERLAP_S = 24 * 3600
"""After a rotation, payloads carry the old secret's signature too for this long."""


class EndpointIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        min_length=1, max_length=ssrf.MAX_URL_CHARS, description="http(s) URL on a public address"
    )
    event_types: list[EventType] = Field(min_length=1, max_length=len(EVENT_TYPES))
    enabled: bool = True


class EndpointPatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(default=None, min_length=1, max_length=ssrf.MAX_URL_CHARS, pattern=URL_PATTERN)
    event_types: list[EventType] | None = Field(default=None, min_length=1, max_length=len(EVENT_TYPES))
    enabled: bool | None = Field(default=None, description="true also clears a disabled_reason")


class EndpointOut(BaseModel):
    id: UUID
    url: str
    event_types: list[str]
    enabled: bool
    disabled_reason: str | None = Field(description="why Clarion disabled the endpoint, if it did")
    disabled_at: datetime | None
    failure_streak: int = Field(description="failed calls since the last successful one")
    failing_since: datetime | None
    created_at: datetime
    updated_at: datetime


class CreatedEndpoint(EndpointOut):
    secret: str = Field(description="whsec_...: verifies every payload; shown only here, store it now")


class RotatedSecret(BaseModel):
    secret: str = Field(description="the new whsec_... secret; shown only here")
    previous_valid_until: datetime = Field(description="payloads carry the old secret's signature until then")


_COLUMNS = tuple(getattr(_endpoints.c, name) for name in EndpointOut.model_fields)


def _out(row: sa.Row) -> EndpointOut:  # type: ignore[type-arg]
    return EndpointOut(**{name: getattr(row, name) for name in EndpointOut.model_fields})


# The API's lookups of endpoint hosts, at most two outstanding per tenant, one per host
# (core/dns.py): a tenant registering hosts whose DNS hangs holds two threads, never every other
# tenant's.
_RESOLVER = Resolver(threads=16, per_key=2, per_host=1)


async def checked_url(url: str, *, allow: ssrf.AllowList, tenant_id: str) -> str:
    """``url`` when it may be called now (``core.ssrf``); else ``ApiError(422)`` with its rule's code."""
    try:
        await ssrf.resolve(url, allow=allow, resolver=_RESOLVER, key=tenant_id)
    except ssrf.UrlRefused as exc:
        raise ApiError(422, exc.code, exc.message, {"field": "url"}) from None
    return url


def _unique(types: list[str]) -> list[str]:
    return sorted(set(types))


async def create_endpoint(
    *, engine: AsyncEngine, tenant_id: str, endpoint: EndpointIn, allow: ssrf.AllowList, max_endpoints: int
) -> CreatedEndpoint:
    """Register an endpoint; its secret is in the result and never shown again."""
    url = await checked_url(endpoint.url, allow=allow, tenant_id=tenant_id)
    secret = new_secret()
    async with engine.begin() as conn:
        await hold_under_cap(
            conn, tenant_id=tenant_id, kind="webhooks", limit=max_endpoints,
            held=sa.select(sa.func.count()).select_from(_endpoints).where(_endpoints.c.tenant_id == tenant_id),
            message=f"A tenant may register {max_endpoints} webhook endpoints; delete one first.",
        )  # fmt: skip
        row = (
            await conn.execute(
                _endpoints.insert()
                .values(
                    id=uuid7(),
                    tenant_id=tenant_id,
                    url=url,
                    event_types=_unique(endpoint.event_types),
                    enabled=endpoint.enabled,
                    secret=secret,
                )
                .returning(*_COLUMNS)
            )
        ).one()
    return CreatedEndpoint(secret=secret, **_out(row).model_dump())


async def list_endpoints(*, engine: AsyncEngine, tenant_id: str) -> list[EndpointOut]:
    """The tenant's endpoints, oldest first; never a secret."""
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.select(*_COLUMNS).where(_endpoints.c.tenant_id == tenant_id).order_by(_endpoints.c.id)
            )
        ).all()
    return [_out(r) for r in rows]


def _mine(tenant_id: str, endpoint_id: UUID) -> sa.ColumnElement[bool]:
    return sa.and_(_endpoints.c.id == endpoint_id, _endpoints.c.tenant_id == tenant_id)


def _not_found(endpoint_id: UUID) -> ApiError:
    return ApiError(404, "not_found", f"No webhook endpoint {endpoint_id}.")


async def get_endpoint(*, engine: AsyncEngine, tenant_id: str, endpoint_id: UUID) -> EndpointOut:
    """One of the tenant's endpoints, with why Clarion disabled it if it did."""
    async with engine.connect() as conn:
        row = (await conn.execute(sa.select(*_COLUMNS).where(_mine(tenant_id, endpoint_id)))).first()
    if row is None:
        raise _not_found(endpoint_id)
    return _out(row)


async def update_endpoint(
    *, engine: AsyncEngine, tenant_id: str, endpoint_id: UUID, patch: EndpointPatch, allow: ssrf.AllowList
) -> EndpointOut:
    """Change the fields ``patch`` sets. Enabling clears ``disabled_reason`` and the failure streak."""
    values: dict[str, object] = {"updated_at": sa.func.now()}
    if patch.url is not None:
        values["url"] = await checked_url(patch.url, allow=allow, tenant_id=tenant_id)
    if patch.event_types is not None:
        values["event_types"] = _unique(patch.event_types)
    if patch.enabled is not None:
        values["enabled"] = patch.enabled
        if patch.enabled:
            values.update(disabled_reason=None, disabled_at=None, failure_streak=0, failing_since=None)
    async with engine.begin() as conn:
        if patch.enabled is not None:  # never while a replay queues (hold_replays: 409 endpoint_busy)
            await hold_replays(conn, tenant_id=tenant_id, endpoint_id=endpoint_id)
        if patch.enabled is False:
            await _settle_pending(conn, tenant_id=tenant_id, endpoint_id=endpoint_id, settle=PARK_PENDING)
        row = (
            await conn.execute(
                _endpoints.update().where(_mine(tenant_id, endpoint_id)).values(**values).returning(*_COLUMNS)
            )
        ).first()
        if row is None:
            raise _not_found(endpoint_id)
        if patch.enabled is False:
            await conn.exec_driver_sql(PARK_PENDING, (endpoint_id,))
        elif patch.enabled:
            # Twice: a statement that waited for the upkeep moving a day's rows out of the default
            # partition was planned before that day was attached and misses what moved (as the
            # worker's record, workers/webhook_record._update_ours); the second sees the day.
            for _ in range(2):
                await conn.exec_driver_sql(UNPARK_PENDING, (endpoint_id,))
    return _out(row)


async def rotate_secret(*, engine: AsyncEngine, tenant_id: str, endpoint_id: UUID) -> RotatedSecret:
    """A new secret; the old one keeps signing alongside it for ``ROTATION_OVERLAP_S``."""
    secret = new_secret()
    async with engine.begin() as conn:
        row = (
            await conn.execute(
                _endpoints.update()
                .where(_mine(tenant_id, endpoint_id))
                .values(
                    secret=secret,
                    previous_secret=_endpoints.c.secret,
                    previous_secret_until=sa.func.now() + sa.text(f"interval '{ROTATION_OVERLAP_S} seconds'"),
                    updated_at=sa.func.now(),
                )
                .returning(_endpoints.c.previous_secret_until)
            )
        ).first()
    if row is None:
        raise _not_found(endpoint_id)
    return RotatedSecret(secret=secret, previous_valid_until=row.previous_secret_until)


async def delete_endpoint(*, engine: AsyncEngine, tenant_id: str, endpoint_id: UUID) -> None:
    """Remove the endpoint; its pending deliveries are cancelled (their days can then expire)."""
    async with engine.begin() as conn:
        # a replay queueing now refuses this (409 endpoint_busy); one after it finds nothing
        await hold_replays(conn, tenant_id=tenant_id, endpoint_id=endpoint_id)
        await _settle_pending(conn, tenant_id=tenant_id, endpoint_id=endpoint_id, settle=CANCEL_PENDING)
        gone = (await conn.execute(_endpoints.delete().where(_mine(tenant_id, endpoint_id)))).rowcount
        if not gone:
            raise _not_found(endpoint_id)
        await cancel_pending(conn, endpoint_id=endpoint_id)


CANCEL_PENDING = (
    "UPDATE webhook_deliveries SET state = 'cancelled' WHERE endpoint_id = $1 AND state = 'pending'"
)


async def cancel_pending(conn: AsyncConnection, *, endpoint_id: UUID) -> None:
    await conn.exec_driver_sql(CANCEL_PENDING, (endpoint_id,))


async def _settle_pending(conn: AsyncConnection, *, tenant_id: str, endpoint_id: UUID, settle: str) -> None:
    """Before disabling or deleting the endpoint: park or cancel its pending deliveries, then wait
    for the deliveries being queued to it now (``core.webhook_events.LOCK_ENDPOINT``), which the
    caller's park or cancel after its change then takes too. The backlog is settled first so the
    endpoint is held ``FOR UPDATE`` only while the few queued meanwhile are: the worker's record of a
    batch, queueing to it, waits that long.

    The endpoint's row is taken first, ``FOR NO KEY UPDATE`` (no enqueue waits for it), as every
    writer of an endpoint and its deliveries does (``workers.webhook_record``, lock order): parking
    first, this held deliveries a record of a call waited to write while holding the endpoint this
    then waited for, a deadlock PostgreSQL broke by cancelling one of them."""
    mine = (
        await conn.execute(
            sa.select(_endpoints.c.id).where(_mine(tenant_id, endpoint_id)).with_for_update(key_share=True)
        )
    ).first()
    if mine is None:
        raise _not_found(endpoint_id)
    await conn.exec_driver_sql(settle, (endpoint_id,))
    await conn.exec_driver_sql(LOCK_ENDPOINT, (endpoint_id,))
