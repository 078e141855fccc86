"""The reads of an accept: each send's recipient, contact, push devices and content, checked
before anything is written (``api.accept``), so a refused send writes nothing.

Each check takes the round's sends by index, records a refusal (an ``ApiError``, 4xx) in
``decisions`` and drops the send from ``recipients``. A check runs one statement whatever the
number of sends (content: one per distinct template).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

import asyncpg

from api.errors import ApiError, unprintable_id
from api.submission import AcceptDecision, Submission
from core.render import Renderer, RenderError
from core.render_types import RenderedContent
from core.templates import TemplateSource, resolve_template
from schema.enums import Channel

if TYPE_CHECKING:
    from api.models import UserIn


@dataclass(slots=True)
class Recipient:
    """A send's recipient as it will be once the send's inline details are upserted."""

    id: UUID | None  # None: a user this send creates
    email: str | None
    phone: str | None
    locale: str | None
    # The send's inline details are what the user already has: upserting them would change
    # nothing but still write a new version of the row (most sends repeat their user's details).
    stored: bool = False


USERS = """
SELECT u.tenant_id, u.external_id, u.id, u.email, u.phone, u.locale, u.timezone
  FROM users u
  JOIN unnest($1::text[], $2::text[]) AS k(tenant_id, external_id)
    ON u.tenant_id = k.tenant_id AND u.external_id = k.external_id
"""
DEVICES = "SELECT user_id, platform, token, active FROM devices WHERE user_id = ANY($1::uuid[])"


def render_error(exc: RenderError) -> ApiError:
    """The 422 a caller gets for content that does not render (names the missing variable)."""
    if exc.code == "missing_variable":
        code = "missing_template_variable"
    elif exc.code == "unsafe_template":
        code = "unsafe_template"
    elif exc.code == "template_syntax":
        code = "template_syntax_error"
    else:
        code = f"template_{exc.code}".replace("template_template_", "template_")
    details = {"variable": exc.variable} if exc.variable else None
    return ApiError(422, code, exc.message, details)


async def find_recipients(
    conn: asyncpg.Connection,
    sends: Sequence[Submission],
    fresh: list[int],
    decisions: list[AcceptDecision | None],
) -> dict[int, Recipient]:
    """Each send's recipient as it will be once its inline details are upserted; refuses sends to an
    unknown ``user_id`` and sends whose channel has no contact."""
    if not fresh:
        return {}
    keys = [sends[i].user_key for i in fresh]
    rows = await conn.fetch(USERS, [k[0] for k in keys], [k[1] for k in keys])
    known = {(r["tenant_id"], r["external_id"]): r for r in rows}
    recipients: dict[int, Recipient] = {}
    for i in fresh:
        req = sends[i].req
        row = known.get(sends[i].user_key)
        if req.user is None and row is None:
            decisions[i] = ApiError(
                422, "unknown_user", f"No user '{req.user_id}'; send 'user' with contact details instead."
            )
            continue
        user = req.user
        recipient = Recipient(
            row["id"] if row else None,
            (user.email if user else None) or (row["email"] if row else None),
            (user.phone if user else None) or (row["phone"] if row else None),
            (user.locale if user else None) or (row["locale"] if row else None),
            stored=row is not None and user is not None and _already_stored(user, row),
        )
        if req.channel is Channel.email and not recipient.email:
            decisions[i] = ApiError(422, "no_contact", "The user has no email address for the email channel.")
        elif req.channel is Channel.sms and not recipient.phone:
            decisions[i] = ApiError(422, "no_contact", "The user has no phone number for the sms channel.")
        else:
            recipients[i] = recipient
    return recipients


def refuse_new_unprintable_ids(
    sends: Sequence[Submission], recipients: dict[int, Recipient], decisions: list[AcceptDecision | None]
) -> None:
    """Refuse the sends that would store a new identifier outside ``clarion.printable_ids``: their
    event id (a repeat was answered before: ``recipients`` holds fresh sends only), or the id of the
    inline user they create. One stored before the rule still works."""
    for i in list(recipients):
        req = sends[i].req
        refusal = unprintable_id("event_id", req.event_id)
        if refusal is None and req.user is not None and recipients[i].id is None:
            refusal = unprintable_id("user.id", req.user.id)
        if refusal is not None:
            decisions[i] = refusal
            del recipients[i]


def _already_stored(user: UserIn, row: asyncpg.Record) -> bool:
    """Every detail the send gives is the one the user has (a detail left out keeps its value)."""
    return all(
        given is None or given == row[name]
        for name, given in (
            ("email", user.email), ("phone", user.phone), ("locale", user.locale),
            ("timezone", user.timezone),
        )
    )  # fmt: skip


async def check_push_devices(
    conn: asyncpg.Connection,
    sends: Sequence[Submission],
    recipients: dict[int, Recipient],
    decisions: list[AcceptDecision | None],
) -> None:
    """Refuse push sends whose user will have no active device (inline tokens a provider reported
    dead stay inactive)."""
    push = [i for i in recipients if sends[i].req.channel is Channel.push]
    if not push:
        return
    known = [recipients[i].id for i in push if recipients[i].id is not None]
    tokens: dict[UUID, dict[tuple[str, str], bool]] = {}
    for row in await conn.fetch(DEVICES, known) if known else []:
        tokens.setdefault(row["user_id"], {})[(row["platform"], row["token"])] = row["active"]
    for i in push:
        user_id = recipients[i].id
        existing = tokens.get(user_id, {}) if user_id is not None else {}
        user = sends[i].req.user
        inline = user.devices if user is not None else []
        if not any(existing.values()) and all((d.platform.value, d.token) in existing for d in inline):
            decisions[i] = ApiError(
                422, "no_device", "The user has no active push device; register one first."
            )
            del recipients[i]


def require_subject(channel: Channel, content: RenderedContent) -> None:
    """An email whose subject renders blank with its data (``{{ order.title }}`` and an empty
    title) would be accepted and then refused by every email provider (``missing_subject``), so it
    is refused here: ``RenderError`` ``empty_subject``, a 422 ``template_empty_subject``."""
    if channel is Channel.email and not (content.subject or "").strip():
        raise RenderError("empty_subject", "the email's subject renders empty with this data", part="subject")


async def check_content(
    conn: asyncpg.Connection,
    renderer: Renderer,
    sends: Sequence[Submission],
    recipients: dict[int, Recipient],
    decisions: list[AcceptDecision | None],
) -> dict[int, TemplateSource]:
    """Render once now so a send that cannot render is refused (422) rather than failing later
    (inline content rendered before the transaction brings its outcome: ``Submission.rendered``).
    Returns the template each templated send will use."""
    resolved: dict[tuple[Any, ...], TemplateSource | None] = {}
    templates: dict[int, TemplateSource] = {}
    for i, recipient in list(recipients.items()):
        principal, req = sends[i].principal, sends[i].req
        if req.content is not None:
            subject = req.content.subject if req.channel is Channel.email else req.content.title
            source: tuple[str | None, str, str | None] = (subject, req.content.body, req.content.html)
        else:
            locale = recipient.locale or principal.default_locale
            key = (principal.tenant_id, req.template, req.channel, locale, req.template_version)
            if key not in resolved:
                resolved[key] = await resolve_template(
                    conn=conn, tenant_id=principal.tenant_id, name=str(req.template),
                    channel=req.channel.value, locale=locale, version=req.template_version,
                    default_locale=principal.default_locale,
                )  # fmt: skip
            template = resolved[key]
            if template is None:
                version = f" version {req.template_version}" if req.template_version else ""
                decisions[i] = ApiError(
                    422,
                    "unknown_template",
                    f"No {req.channel.value} template '{req.template}'{version} for locale '{locale}'.",
                )
                del recipients[i]
                continue
            templates[i] = template
            source = (template.subject, template.body, template.html)
        rendered = sends[i].rendered
        try:
            if rendered is None:
                content = await renderer.render_async(
                    subject=source[0],
                    body=source[1],
                    html=source[2],
                    data=req.data,
                    budget=sends[i].render_budget,
                    tenant=principal.tenant_id,
                )
                require_subject(req.channel, content)
            elif rendered.error is not None:
                raise rendered.error
        except RenderError as exc:
            decisions[i] = render_error(exc)
            del recipients[i]
            templates.pop(i, None)
    return templates
