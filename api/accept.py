"""Accepting a send: validate against the tenant's data, persist to the log, hand to the outbox.

The row is committed before the caller hears ``202``; publishing happens after, and the outbox
relay republishes anything that never reached the broker. This is the API's hot path, so it runs
plain SQL on an asyncpg pool: four short statements in one transaction.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import asyncpg

from api.errors import ApiError
from api.models import NotificationIn, UserIn
from clarion.tenants import Principal
from schema.enums import Channel, Status
from schema.ids import uuid7
from schema.messages import NotificationMessage
from workers.render import Renderer, RenderError
from workers.templates import resolve_template_pg


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


UPSERT_USER = """
INSERT INTO users (id, tenant_id, external_id, email, phone, locale, timezone)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT ON CONSTRAINT uq_users_tenant_external DO UPDATE
   SET email = coalesce(EXCLUDED.email, users.email),
       phone = coalesce(EXCLUDED.phone, users.phone),
       locale = coalesce(EXCLUDED.locale, users.locale),
       timezone = coalesce(EXCLUDED.timezone, users.timezone),
       updated_at = CASE WHEN (EXCLUDED.email, EXCLUDED.phone, EXCLUDED.locale, EXCLUDED.timezone)
                              IS NOT DISTINCT FROM (users.email, users.phone, users.locale, users.timezone)
                         THEN users.updated_at ELSE now() END
RETURNING id, email, phone, locale
"""

# Inline devices never reactivate a token a provider reported dead; explicit registration does.
INSERT_DEVICES = """
INSERT INTO devices (id, user_id, platform, token)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[])
ON CONFLICT DO NOTHING
"""

KNOWN_USER = "SELECT id, email, phone, locale FROM users WHERE tenant_id = $1 AND external_id = $2"
HAS_DEVICE = "SELECT EXISTS (SELECT 1 FROM devices WHERE user_id = $1 AND active)"
EXISTING = "SELECT id, status, request_hash FROM notifications WHERE tenant_id = $1 AND event_id = $2"
INSERT = """
INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, category, priority,
                           template, template_version, locale, content, data, send_at, expires_at, status,
                           not_before, history, attempts)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, 0)
ON CONFLICT ON CONSTRAINT uq_notifications_event DO NOTHING
RETURNING id
"""


async def _upsert_user(conn: asyncpg.Connection, tenant_id: str, user: UserIn) -> _Recipient:
    row = await conn.fetchrow(
        UPSERT_USER, uuid7(), tenant_id, user.id, user.email, user.phone, user.locale, user.timezone
    )
    if user.devices:
        await conn.execute(
            INSERT_DEVICES,
            [uuid7() for _ in user.devices],
            [row["id"]] * len(user.devices),
            [d.platform.value for d in user.devices],
            [d.token for d in user.devices],
        )
    return _Recipient(row["id"], row["email"], row["phone"], row["locale"])


async def _known_user(conn: asyncpg.Connection, tenant_id: str, external_id: str) -> _Recipient:
    row = await conn.fetchrow(KNOWN_USER, tenant_id, external_id)
    if row is None:
        raise ApiError(
            422, "unknown_user", f"No user '{external_id}'; send 'user' with contact details instead."
        )
    return _Recipient(row["id"], row["email"], row["phone"], row["locale"])


async def _check_contact(conn: asyncpg.Connection, channel: Channel, user: _Recipient) -> None:
    if channel is Channel.email and not user.email:
        raise ApiError(422, "no_contact", "The user has no email address for the email channel.")
    if channel is Channel.sms and not user.phone:
        raise ApiError(422, "no_contact", "The user has no phone number for the sms channel.")
    if channel is Channel.push and not await conn.fetchval(HAS_DEVICE, user.id):
        raise ApiError(422, "no_device", "The user has no active push device; register one first.")


def render_error(exc: RenderError) -> ApiError:
    """The 422 a caller gets for content that does not render (names the missing variable)."""
    if exc.code == "missing_variable":
        code = "missing_template_variable"
    elif exc.code == "unsafe_template":
        code = "unsafe_template"
    else:
        code = f"template_{exc.code}".replace("template_template_", "template_")
    details = {"variable": exc.variable} if exc.variable else None
    return ApiError(422, code, exc.message, details)


async def _check_content(
    conn: asyncpg.Connection, renderer: Renderer, principal: Principal, req: NotificationIn, user: _Recipient
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
    template = await resolve_template_pg(
        conn=conn, tenant_id=principal.tenant_id, name=req.template, channel=req.channel.value,
        locale=locale, version=req.template_version, default_locale=principal.default_locale,
    )  # fmt: skip
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


async def _existing(
    conn: asyncpg.Connection, tenant_id: str, event_id: str, digest: str
) -> AcceptResult | None:
    row = await conn.fetchrow(EXISTING, tenant_id, event_id)
    if row is None:
        return None
    if row["request_hash"] != digest:
        raise ApiError(
            409,
            "event_id_conflict",
            f"event_id '{event_id}' was already used for a different notification.",
            {"id": str(row["id"])},
        )
    return AcceptResult(row["id"], row["status"], True, None)


async def accept_notification(
    *, pool: asyncpg.Pool, renderer: Renderer, principal: Principal, req: NotificationIn
) -> AcceptResult:
    """Persist one send and return its id. Repeats of an event_id return the first notification
    (``duplicate``); a repeat with a different body is a 409.

    Raises ``ApiError`` (4xx) for anything the caller must fix; nothing is written then.
    """
    digest = request_hash(req)
    async with pool.acquire() as conn, conn.transaction():
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
        inserted = await conn.fetchval(
            INSERT, notification_id, principal.tenant_id, req.event_id, digest, user.id, req.channel.value,
            req.category, req.priority.value, req.template, version, locale or user.locale, content, req.data,
            req.send_at, req.expires_at, status.value, req.send_at if scheduled else None,
            [transition(status.value, at=now)],
        )  # fmt: skip
        if inserted is None:  # a concurrent request with the same event_id won the race
            raced = await _existing(conn, principal.tenant_id, req.event_id, digest)
            assert raced is not None
            return raced
    message = None
    if not scheduled:
        message = NotificationMessage(
            id=notification_id, tenant_id=principal.tenant_id, channel=req.channel, user_id=user.id,
            priority=req.priority,
        )  # fmt: skip
    return AcceptResult(notification_id, status.value, False, message)
