"""The main lane wins over a bulk backlog, over the real broker and PostgreSQL.

A worker of its own (own broker and database, so the backlog never slows the shared stack) starts
with 2,000 bulk emails already on ``notifications.email.bulk``. Once the bulk lane is draining, a
``critical`` email arrives on the main lane, and the provider holds that one send open, so the
main lane has work in flight for as long as the test wants. Then:

- the bulk lane stops at the next chunk boundary and waits (it finishes at most the one chunk it
  had started), while most of the backlog is still queued;
- once the critical send completes and is recorded, the bulk lane resumes and the whole backlog
  drains: every bulk email sent exactly once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import ClassVar
from uuid import UUID

import asyncpg
import pytest

from clarion.broker import TansuBroker
from clarion.kafka import Publisher, create_topics
from clarion.settings import Settings
from harness.services import drop_database, fresh_database, wait_until
from providers.base import RenderedMessage, SendResult
from providers.registry import ProviderSet
from schema.db import create_engine
from schema.enums import Channel, Priority
from schema.ids import uuid7
from schema.messages import NotificationMessage
from tests.conftest import make_tenant
from workers.app import Worker

BACKLOG = 2_000
CHUNK = 25


class GatedProvider:
    """Accepts every email, remembering the order of calls. Holds the sends of ``held``
    notifications until ``release``, and bulk sends beyond the first ``bulk_pause_after`` until
    ``bulk_resume`` (so the test knows a bulk chunk is under way when the urgent email arrives)."""

    name: ClassVar[str] = "gated"
    channel: ClassVar[Channel] = Channel.email

    def __init__(self, *, bulk_pause_after: int) -> None:
        self.calls: list[tuple[UUID, Priority]] = []
        self.held: set[UUID] = set()
        self.release = asyncio.Event()
        self.bulk_pause_after = bulk_pause_after
        self.bulk_resume = asyncio.Event()

    async def send(self, message: RenderedMessage) -> SendResult:
        self.calls.append((message.notification_id, message.priority))
        if message.notification_id in self.held:
            await self.release.wait()
        elif message.priority is Priority.bulk and self.bulk_calls() > self.bulk_pause_after:
            await self.bulk_resume.wait()
        return SendResult(self.name, f"gated-{message.notification_id}")

    async def aclose(self) -> None:
        return None

    def bulk_calls(self) -> int:
        return sum(1 for _, p in self.calls if p is Priority.bulk)

    def called(self, notification_id: UUID) -> bool:
        return any(nid == notification_id for nid, _ in self.calls)


@dataclass
class Lanes:
    dsn: str
    tenant_id: str
    users: list[UUID]
    publisher: Publisher
    provider: GatedProvider
    worker: Worker
    bulk_ids: list[UUID] = field(default_factory=list)


async def insert_emails(
    lanes: Lanes, count: int, *, priority: Priority, prefix: str
) -> list[NotificationMessage]:
    """``count`` accepted emails in the log (as the API would leave them), not yet published."""
    content = json.dumps({"subject": "Sale {{ n }}", "body": "Everything must go ({{ n }})"})
    messages = [
        NotificationMessage(
            id=uuid7(),
            tenant_id=lanes.tenant_id,
            channel=Channel.email,
            user_id=lanes.users[i % len(lanes.users)],
            priority=priority,
        )
        for i in range(count)
    ]
    conn = await asyncpg.connect(lanes.dsn)
    try:
        await conn.executemany(
            """INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel,
                                          category, priority, content, data, status)
               VALUES ($1, $2, $3, $4, $5, 'email', $6, $7, $8::jsonb, $9::jsonb, 'accepted')""",
            [
                (
                    m.id,
                    lanes.tenant_id,
                    f"{prefix}-{i}",
                    hashlib.sha256(f"{prefix}-{i}".encode()).hexdigest(),
                    m.user_id,
                    "marketing" if priority is Priority.bulk else "security",
                    priority.value,
                    content,
                    json.dumps({"n": i}),
                )
                for i, m in enumerate(messages)
            ],
        )
    finally:
        await conn.close()
    return messages


async def statuses(lanes: Lanes, ids: list[UUID]) -> dict[str, int]:
    conn = await asyncpg.connect(lanes.dsn)
    try:
        rows = await conn.fetch(
            "SELECT status, count(*) AS n FROM notifications WHERE id = ANY($1::uuid[]) GROUP BY status", ids
        )
    finally:
        await conn.close()
    return {r["status"]: int(r["n"]) for r in rows}


@pytest.fixture
async def lanes(settings: Settings) -> AsyncIterator[Lanes]:
    broker = TansuBroker()
    broker.start()
    url = await fresh_database("clarion_lanes")
    dsn = url.replace("postgresql+asyncpg://", "postgresql://", 1)
    own = settings.model_copy(
        update={
            "database_url": url,
            "kafka_bootstrap": broker.bootstrap,
            "lease_s": 60.0,
            "worker_batch_size": 500,
            "worker_bulk_chunk": CHUNK,
            "worker_bulk_yield_max_s": 300.0,  # strict: the bulk lane never overrides the main lane here
            "retry": settings.retry.model_copy(update={"attempt_timeout_s": 300.0}),  # held sends
        }
    )
    await create_topics(broker.bootstrap, partitions=2)
    engine = create_engine(url, pool_size=1)
    tenant = await make_tenant(engine)
    await engine.dispose()
    conn = await asyncpg.connect(dsn)
    try:
        users = [uuid7() for _ in range(50)]
        await conn.executemany(
            "INSERT INTO users (id, tenant_id, external_id, email) VALUES ($1, $2, $3, $4)",
            [(u, tenant.id, f"u-{i}", f"u{i}@example.com") for i, u in enumerate(users)],
        )
    finally:
        await conn.close()
    provider = GatedProvider(bulk_pause_after=2 * CHUNK)
    worker = Worker(own, Channel.email, providers=ProviderSet(routes={(Channel.email, None): provider}))
    publisher = Publisher(broker.bootstrap)
    yield Lanes(dsn, tenant.id, users, publisher, provider, worker)
    provider.release.set()
    await worker.stop()
    await publisher.close()
    broker.stop()
    await drop_database(url)


async def test_critical_email_goes_ahead_of_a_bulk_backlog_which_still_drains(lanes: Lanes) -> None:
    backlog = await insert_emails(lanes, BACKLOG, priority=Priority.bulk, prefix="bulk")
    [critical] = await insert_emails(lanes, 1, priority=Priority.critical, prefix="otp")
    provider, priority = lanes.provider, lanes.worker.lanes
    provider.held.add(critical.id)
    assert len(await lanes.publisher.publish_many(backlog)) == BACKLOG  # all on the .bulk lane
    await lanes.worker.start()

    # Two bulk chunks delivered; the third is under way (held in the provider) when the critical
    # email arrives on the main lane and reaches the provider (held too: main-lane work in flight).
    await wait_until(lambda: provider.bulk_calls() > 2 * CHUNK, timeout_s=60)
    assert await lanes.publisher.publish_many([critical]) == [str(critical.id)]
    await wait_until(lambda: provider.called(critical.id), timeout_s=60)
    assert priority.main_in_flight == 1

    # The chunk under way completes; the next one waits for its turn, with most of the backlog queued.
    provider.bulk_resume.set()
    await wait_until(lambda: priority.bulk_waiting == 1, timeout_s=60)
    held_at = provider.bulk_calls()
    assert held_at <= 3 * CHUNK
    assert (await statuses(lanes, [m.id for m in backlog])).get("accepted", 0) >= BACKLOG - 3 * CHUNK
    await asyncio.sleep(0.5)  # that nothing moves for a while is what is tested: an absence cannot be polled
    assert provider.bulk_calls() == held_at and priority.bulk_waiting == 1  # still waiting

    # The critical send completes and is recorded; then the bulk lane resumes and drains fully.
    provider.release.set()

    async def critical_sent() -> bool:
        return (await statuses(lanes, [critical.id])) == {"sent": 1}

    await wait_until(critical_sent, timeout_s=30)

    async def backlog_drained() -> dict[str, int] | None:
        counts = await statuses(lanes, [m.id for m in backlog])
        return counts if counts == {"sent": BACKLOG} else None

    await wait_until(backlog_drained, timeout_s=120, interval_s=0.5)
    bulk_sent = [nid for nid, p in provider.calls if p is Priority.bulk]
    assert sorted(bulk_sent) == sorted(m.id for m in backlog)  # each bulk email sent exactly once
    critical_at = next(i for i, (nid, _) in enumerate(provider.calls) if nid == critical.id)
    assert provider.calls[critical_at + 1 :].count((critical.id, Priority.critical)) == 0  # sent once
    assert sum(1 for _, p in provider.calls[:critical_at] if p is Priority.bulk) <= 3 * CHUNK
    assert priority.overridden == 0
