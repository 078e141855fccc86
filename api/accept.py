"""Accepting a send: validate against the tenant's data, persist to the log, hand to the outbox.

The row is committed before the caller hears ``202``; publishing happens after, and the outbox
relay republishes anything that never reached the broker.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.errors import ApiError
from api.models import NotificationIn, UserIn
from clarion.tenants import Principal
from schema.enums import Channel, Status
from schema.ids import uuid7
from schema.messages import NotificationMessage
from schema.models import Device, Notification, User
from workers.render import Renderer, RenderError
from workers.templates import resolve_template

_users = User.__table__  # type: ignore[attr-defined]
_devices = Device.__table__  # type: ignore[attr-defined]
_notifications = Notification.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class AcceptResult:
    id: UUID
    status: str
    duplicate: bool
    message: NotificationMessage | None  # None for a duplicate: nothing new to publish


@dataclass(frozen=True, slots=True)
class _Recipient:
    id: UUID
    email: str | None
    phone: str | None
    locale: str | None


def request_hash(req: NotificationIn) -> str:
    canonical = json.dumps(req.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def transition(status: str, detail: str | None = None, at: datetime | None = None) -> dict[str, Any]:
    return {"status": status, "at": (at or datetime.now(UTC)).isoformat(), "detail": detail}


async def _upsert_user(conn: AsyncConnection, tenant_id: str, user: UserIn) -> _Recipient:
    base = insert(_users).values(
        id=uuid7(),
        tenant_id=tenant_id,
        external_id=user.id,
        email=user.email,
        phone=user.phone,
        locale=user.locale,
        timezone=user.timezone,
    )
    ex = base.excluded
    stmt = base.on_conflict_do_update(
        constraint="uq_users_tenant_external",
        set_={
            "email": sa.func.coalesce(ex.email, _users.c.email),
            "phone": sa.func.coalesce(ex.phone, _users.c.phone),
            "locale": sa.func.coalesce(ex.locale, _users.c.locale),
            "timezone": sa.func.coalesce(ex.timezone, _users.c.timezone),
            "updated_at": sa.func.now(),
        },
    ).returning(_users.c.id, _users.c.email, _users.c.phone, _users.c.locale)
    row = (await conn.execute(stmt)).one()
    if user.devices:
        # Inline devices never reactivate a token a provider reported dead; explicit device
        # registration does.
        await conn.execute(
            insert(_devices)
            .values(
                [
                    {"id": uuid7(), "user_id": row.id, "platform": d.platform.value, "token": d.token}
                    for d in user.devices
                ]
            )
            .on_conflict_do_nothing()
        )
    return _Recipient(row.id, row.email, row.phone, row.locale)


async def _known_user(conn: AsyncConnection, tenant_id: str, external_id: str) -> _Recipient:
    row = (
        await conn.execute(
            sa.select(_users.c.id, _users.c.email, _users.c.phone, _users.c.locale).where(
                _users.c.tenant_id == tenant_id, _users.c.external_id == external_id
            )
        )
    ).first()
    if row is None:
        raise ApiError(
            422, "unknown_user", f"No user '{external_id}'; send 'user' with contact details instead."
        )
    return _Recipient(row.id, row.email, row.phone, row.locale)


async def _check_contact(conn: AsyncConnection, channel: Channel, user: _Recipient) -> None:
    if channel is Channel.email and not user.email:
        raise ApiError(422, "no_contact", "The user has no email address for the email channel.")
    if channel is Channel.sms and not user.phone:
        raise ApiError(422, "no_contact", "The user has no phone number for the sms channel.")
    if channel is Channel.push:
        has_device = (
            await conn.execute(
                sa.select(sa.literal(1))
                .where(_devices.c.user_id == user.id, _devices.c.active.is_(True))
                .limit(1)
            )
        ).first()
        if has_device is None:
            raise ApiError(422, "no_device", "The user has no active push device; register one first.")


def render_error(exc: RenderError) -> ApiError:
    code = "missing_template_variable" if exc.code == "missing_variable" else f"template_{exc.code}"
    if exc.code == "unsafe_template":
        code = "unsafe_template"
    details = {"variable": exc.variable} if exc.variable else None
    return ApiError(422, code, exc.message, details)


async def _check_content(
    conn: AsyncConnection, renderer: Renderer, principal: Principal, req: NotificationIn, user: _Recipient
) -> tuple[int | None, str | None]:
    """Render once now so a send that cannot render is refused (422) rather than failing later."""
    if req.content is not None:
        subject = req.content.subject if req.channel is Channel.email else req.content.title
        try:
            renderer.render(subject=subject, body=req.content.body, html=req.content.html, data=req.data)
        except RenderError as exc:
            raise render_error(exc) from None
        return None, None
    assert req.template is not None
    locale = user.locale or principal.default_locale
    template = await resolve_template(
        conn=conn,
        tenant_id=principal.tenant_id,
        name=req.template,
        channel=req.channel.value,
        locale=locale,
        version=req.template_version,
        default_locale=principal.default_locale,
    )
    if template is None:
        version = f" version {req.template_version}" if req.template_version else ""
        raise ApiError(
            422,
            "unknown_template",
            f"No {req.channel.value} template '{req.template}'{version} for locale '{locale}'.",
        )
    try:
        renderer.render(subject=template.subject, body=template.body, html=template.html, data=req.data)
    except RenderError as exc:
        raise render_error(exc) from None
    return template.version, template.locale


async def _existing(conn: AsyncConnection, tenant_id: str, event_id: str, digest: str) -> AcceptResult | None:
    row = (
        await conn.execute(
            sa.select(_notifications.c.id, _notifications.c.status, _notifications.c.request_hash).where(
                _notifications.c.tenant_id == tenant_id, _notifications.c.event_id == event_id
            )
        )
    ).first()
    if row is None:
        return None
    if row.request_hash != digest:
        raise ApiError(
            409,
            "event_id_conflict",
            f"event_id '{event_id}' was already used for a different notification.",
            {"id": str(row.id)},
        )
    return AcceptResult(row.id, row.status, True, None)


async def accept_notification(
    *, engine: AsyncEngine, renderer: Renderer, principal: Principal, req: NotificationIn
) -> AcceptResult:
    """Persist one send and return its id. Repeats of an event_id return the first notification.

    Raises ``ApiError`` (4xx) for anything the caller must fix; nothing is written then.
    """
    digest = request_hash(req)
    async with engine.begin() as conn:
        existing = await _existing(conn, principal.tenant_id, req.event_id, digest)
        if existing is not None:
            return existing
        user = (
            await _upsert_user(conn, principal.tenant_id, req.user)
            if req.user is not None
            else await _known_user(conn, principal.tenant_id, req.external_user_id)
        )
        await _check_contact(conn, req.channel, user)
        version, locale = await _check_content(conn, renderer, principal, req, user)
        now = datetime.now(UTC)
        scheduled = req.send_at is not None and req.send_at > now
        status = Status.scheduled if scheduled else Status.accepted
        notification_id = uuid7()
        content = req.content.model_dump(exclude_none=True) if req.content else None
        inserted = (
            await conn.execute(
                insert(_notifications)
                .values(
                    id=notification_id,
                    tenant_id=principal.tenant_id,
                    event_id=req.event_id,
                    request_hash=digest,
                    user_id=user.id,
                    channel=req.channel.value,
                    category=req.category,
                    priority=req.priority.value,
                    template=req.template,
                    template_version=version,
                    locale=locale or user.locale,
                    content=content,
                    data=req.data,
                    send_at=req.send_at,
                    expires_at=req.expires_at,
                    status=status.value,
                    not_before=req.send_at if scheduled else None,
                    history=[transition(status.value, at=now)],
                )
                .on_conflict_do_nothing(constraint="uq_notifications_event")
                .returning(_notifications.c.id)
            )
        ).first()
        if inserted is None:  # a concurrent request with the same event_id won the race
            raced = await _existing(conn, principal.tenant_id, req.event_id, digest)
            assert raced is not None
            return raced
    message = (
        None
        if scheduled
        else NotificationMessage(
            id=notification_id,
            tenant_id=principal.tenant_id,
            channel=req.channel,
            user_id=user.id,
            priority=req.priority,
        )
    )
    return AcceptResult(notification_id, status.value, False, message)
