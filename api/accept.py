"""Accepting sends: validate against the tenant's data, persist to the log, hand to the outbox.

The row is committed before the caller hears ``202``; publishing happens after, and the outbox
relay republishes anything that never reached the broker.

This is the API's hot path, and on these machines every database round trip costs more than the
work it carries, so :func:`accept_many` is set-based: any number of sends, of one tenant or
several, are accepted in one transaction with the same few statements, whatever their number.
It reads first (earlier uses of the event ids, the users, their devices, the templates), so a send
refused for something the caller must fix writes nothing; then it writes what passed (users,
devices, notifications), each in a sorted order so concurrent transactions never deadlock.
Sends that must be applied one after another (the same event id twice, or the same user with
different contact details) go in successive rounds of that transaction: the result is what
accepting them one by one, in order, would give.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg

from api.accept_checks import (
    Recipient,
    check_content,
    check_push_devices,
    find_recipients,
    refuse_new_unprintable_ids,
)
from api.idempotency import existing_keys, key_locks, not_repeats, repeat_of
from api.models import UserIn
from api.submission import AcceptDecision, AcceptResult, Submission
from core.devices import RETIRE_EXTRA
from core.render import Renderer
from core.templates import TemplateSource
from schema.enums import Status
from schema.ids import uuid7
from schema.messages import NotificationMessage


def transition(status: str, detail: str | None = None, at: datetime | None = None) -> dict[str, Any]:
    return {"status": status, "at": (at or datetime.now(UTC)).isoformat(), "detail": detail}


UPSERT_USERS = """
INSERT INTO users (id, tenant_id, external_id, email, phone, locale, timezone)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
ON CONFLICT ON CONSTRAINT uq_users_tenant_external DO UPDATE
   SET email = coalesce(EXCLUDED.email, users.email),
       phone = coalesce(EXCLUDED.phone, users.phone),
       locale = coalesce(EXCLUDED.locale, users.locale),
       timezone = coalesce(EXCLUDED.timezone, users.timezone),
       updated_at = CASE WHEN (EXCLUDED.email, EXCLUDED.phone, EXCLUDED.locale, EXCLUDED.timezone)
                              IS NOT DISTINCT FROM (users.email, users.phone, users.locale, users.timezone)
                         THEN users.updated_at ELSE now() END
RETURNING tenant_id, external_id, id
"""
# Inline devices never reactivate a token a provider reported dead; explicit registration does.
INSERT_DEVICES = """
INSERT INTO devices (id, user_id, platform, token)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[])
ON CONFLICT DO NOTHING
RETURNING user_id
"""
RETIRE_EXTRA_DEVICES = RETIRE_EXTRA.format(users="$1::uuid[]")  # core/devices.py
# The key first (api/idempotency.py): a row of today's keys already there (a concurrent first use,
# which the lock made wait) conflicts on the key's primary key; one of yesterday's (a first use just
# before midnight) is found by the re-check, whose snapshot is taken after EXISTING took the locks
# (a subquery per key, not NOT EXISTS: an anti-join hashed a young partition whole, see EXISTING).
# Either way the notification is not written and the send is answered as a repeat.
INSERT = """
WITH v AS MATERIALIZED (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::uuid[], $6::text[], $7::text[],
                         $8::text[], $9::text[], $10::int[], $11::text[], $12::text[], $13::text[],
                         $14::timestamptz[], $15::timestamptz[], $16::text[], $17::timestamptz[], $18::text[],
                         $19::text[])
           AS v(id, tenant_id, event_id, request_hash, user_id, channel, category, priority, template,
                template_version, locale, content, data, send_at, expires_at, status, not_before, history,
                traceparent)
), keys AS (
    INSERT INTO notification_keys (tenant_id, event_id, day, notification_id, request_hash)
    SELECT v.tenant_id, v.event_id, (now() AT TIME ZONE 'UTC')::date, v.id, v.request_hash
      FROM v
     WHERE (SELECT 1 FROM notification_keys y
             WHERE y.day BETWEEN $20::date AND $21::date
               AND y.tenant_id = v.tenant_id AND y.event_id = v.event_id
             LIMIT 1) IS NULL
    ON CONFLICT DO NOTHING
    RETURNING notification_id
)
INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, category, priority,
                           template, template_version, locale, content, data, send_at, expires_at, status,
                           not_before, history, traceparent, attempts)
SELECT v.id, tenant_id, event_id, request_hash, user_id, channel, category, priority, template,
       template_version, locale, content::jsonb, data::jsonb, send_at, expires_at, status, not_before,
       history::jsonb, traceparent, 0
  FROM v JOIN keys ON keys.notification_id = v.id
RETURNING id
"""


async def accept_many(
    *, conn: asyncpg.Connection, renderer: Renderer, sends: Sequence[Submission]
) -> list[AcceptDecision]:
    """Accept ``sends`` in one transaction; returns, in order, each one's ``AcceptResult`` or the
    ``ApiError`` (4xx) that refused it. A refused send writes nothing.

    A repeat of an event id returns the first notification (``duplicate``); a repeat with a
    different body is a 409. Raises only what the database raises (the transaction is then rolled
    back whole: nothing of any send is kept).
    """
    decisions: list[AcceptDecision | None] = [None] * len(sends)
    todo = list(range(len(sends)))
    locks = key_locks(
        s.event_key for s in sends
    )  # all of them in the first round: later rounds take none out of order
    async with conn.transaction():
        while todo:
            now, todo = _next_round(sends, todo)
            await _accept_round(conn, renderer, sends, now, decisions, locks)
            locks = []
    assert all(d is not None for d in decisions)
    return decisions  # type: ignore[return-value]


def _next_round(sends: Sequence[Submission], todo: list[int]) -> tuple[list[int], list[int]]:
    """Split ``todo`` into sends that can be accepted together and those that must wait for them."""
    events: set[tuple[str, str]] = set()
    upserted: dict[tuple[str, str], UserIn] = {}
    now: list[int] = []
    later: list[int] = []
    for i in todo:
        send = sends[i]
        user = send.req.user
        waits = send.event_key in events or (
            upserted.get(send.user_key, user) != user if user is not None else send.user_key in upserted
        )
        if waits:
            later.append(i)
            continue
        events.add(send.event_key)
        if user is not None:
            upserted[send.user_key] = user
        now.append(i)
    return now, later


async def _accept_round(
    conn: asyncpg.Connection,
    renderer: Renderer,
    sends: Sequence[Submission],
    batch: list[int],
    decisions: list[AcceptDecision | None],
    locks: list[int],
) -> None:
    fresh = await not_repeats(conn, sends, batch, decisions, locks)
    recipients = await find_recipients(conn, sends, fresh, decisions)
    refuse_new_unprintable_ids(sends, recipients, decisions)
    await check_push_devices(conn, sends, recipients, decisions)
    versions = await check_content(conn, renderer, sends, recipients, decisions)
    passed = [i for i in fresh if decisions[i] is None]
    if not passed:
        return
    ids = await _upsert_users(conn, sends, [i for i in passed if not recipients[i].stored])
    for i in passed:
        if sends[i].user_key in ids:
            recipients[i].id = ids[sends[i].user_key]
    await _insert_devices(conn, sends, passed, recipients)
    await _insert_notifications(conn, sends, passed, recipients, versions, decisions)


async def _upsert_users(
    conn: asyncpg.Connection, sends: Sequence[Submission], passed: list[int]
) -> dict[tuple[str, str], UUID]:
    """Upsert the inline users (sorted, so concurrent transactions lock them in one order);
    returns their ids by (tenant, external id)."""
    inline: dict[tuple[str, str], UserIn] = {}
    for i in passed:
        if (user := sends[i].req.user) is not None:
            inline[sends[i].user_key] = user
    if not inline:
        return {}
    keys = sorted(inline)
    users = [inline[k] for k in keys]
    rows = await conn.fetch(
        UPSERT_USERS, [uuid7() for _ in keys], [k[0] for k in keys], [k[1] for k in keys],
        [u.email for u in users], [u.phone for u in users], [u.locale for u in users],
        [u.timezone for u in users],
    )  # fmt: skip
    return {(r["tenant_id"], r["external_id"]): r["id"] for r in rows}


async def _insert_devices(
    conn: asyncpg.Connection, sends: Sequence[Submission], passed: list[int], recipients: dict[int, Recipient]
) -> None:
    unique: set[tuple[UUID, str, str]] = set()
    for i in passed:
        user, user_id = sends[i].req.user, recipients[i].id
        if user is not None and user_id is not None:
            unique.update((user_id, d.platform.value, d.token) for d in user.devices)
    devices = sorted(unique)
    if devices:
        added = await conn.fetch(
            INSERT_DEVICES, [uuid7() for _ in devices], [d[0] for d in devices], [d[1] for d in devices],
            [d[2] for d in devices],
        )  # fmt: skip
        if added:  # a device new to its user: keep the user within MAX_ACTIVE_DEVICES
            await conn.execute(RETIRE_EXTRA_DEVICES, sorted({r["user_id"] for r in added}))


async def _insert_notifications(
    conn: asyncpg.Connection,
    sends: Sequence[Submission],
    passed: list[int],
    recipients: dict[int, Recipient],
    templates: dict[int, TemplateSource],
    decisions: list[AcceptDecision | None],
) -> None:
    now = datetime.now(UTC)
    order = sorted(passed, key=lambda i: sends[i].event_key)
    rows: list[tuple[Any, ...]] = []
    statuses: list[Status] = []
    for i in order:
        principal, req = sends[i].principal, sends[i].req
        scheduled = req.send_at is not None and req.send_at > now
        status = Status.scheduled if scheduled else Status.accepted
        statuses.append(status)
        template = templates.get(i)
        locale = (template.locale if template else None) or recipients[i].locale
        content = req.content.model_dump(exclude_none=True) if req.content else None
        rows.append(
            (
                uuid7(), principal.tenant_id, req.event_id, sends[i].digest, recipients[i].id,
                req.channel.value, req.category, req.priority.value, req.template,
                template.version if template else None, locale,
                json.dumps(content) if content is not None else None, json.dumps(req.data), req.send_at,
                req.expires_at, status.value, req.send_at if scheduled else None,
                json.dumps([transition(status.value, at=now)]), sends[i].traceparent,
            )
        )  # fmt: skip
    # Yesterday by the database's clock lies in [two days ago, today] by this process's: the
    # re-check looks at those days (a key of today seen there is a repeat too), named as values so
    # the planner leaves every other day out of the plan.
    today = now.date()
    recheck = [today - timedelta(days=2), today]
    columns = [list(column) for column in zip(*rows, strict=True)]
    inserted = set(await _fetch_column(conn, INSERT, [*columns, *recheck]))
    raced = [sends[i] for i, row in zip(order, rows, strict=True) if row[0] not in inserted]
    # A concurrent request with the same event_id won the race: answer as a repeat of it.
    seen = await existing_keys(conn, raced, []) if raced else {}
    for i, row, status in zip(order, rows, statuses, strict=True):
        send, notification_id = sends[i], row[0]
        if notification_id not in inserted:
            decisions[i] = repeat_of(seen[send.event_key], send)
            continue
        message = None
        if status is Status.accepted:  # a scheduled one is published by the relay when due
            message = NotificationMessage(
                id=notification_id, tenant_id=send.principal.tenant_id, channel=send.req.channel,
                user_id=recipients[i].id, priority=send.req.priority, traceparent=send.traceparent,
            )  # fmt: skip
        template = templates.get(i)
        version = template.version if template else None
        decisions[i] = AcceptResult(notification_id, status.value, False, message, version)


async def _fetch_column(conn: asyncpg.Connection, query: str, args: list[Any]) -> list[Any]:
    return [r[0] for r in await conn.fetch(query, *args)]
