"""A send deferred for its tenant's busy render turn is deferred a bounded number of times.

Before, nothing bounded how often one row was deferred (``render_deferred``): a tenant whose
renders stayed slow could keep a row claimed, recorded and deferred for ever. Now the row already
deferred ``max_deferrals`` times is ``dead`` (``render_deferred_too_often``) at its next deferral,
alone; a row under the bound is still delayed, and sent once its turn comes.

The first tests run the pipeline on claimed rows (``tests/workers/test_isolation.py``'s harness);
the last claims, defers and records one notification on the real log until the bound ends it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, cast
from uuid import UUID

import asyncpg
import httpx
import pytest
from prometheus_client import REGISTRY

from core.render import Renderer
from providers.registry import ProviderSet
from schema.enums import Channel
from schema.messages import NotificationMessage
from tests.fixtures.render_turn import turn_held
from tests.fixtures.sends import held_back
from tests.fixtures.sms_lane import sms_send
from tests.workers.test_isolation import Recording, build, by_event, row
from workers.content import Content
from workers.pipeline import Pipeline
from workers.recipients import Address
from workers.render_deferral import RENDER_DEFERRED, TOO_OFTEN
from workers.retry import RetryPolicy
from workers.send import Sender

MAX = 3


def deferrals_counted() -> Counter[tuple[str, str]]:
    """``clarion_worker_render_deferrals_total`` of SMS now, by (tenant, decision)."""
    [family] = [f for f in REGISTRY.collect() if f.name == "clarion_worker_render_deferrals"]
    return Counter(
        {
            (s.labels["tenant"], s.labels["decision"]): int(s.value)
            for s in family.samples
            if s.name.endswith("_total") and s.labels["channel"] == "sms"
        }
    )


def deferring(pipeline: Pipeline) -> Renderer:
    """``pipeline``'s renderer, its turns given up on at once (a held turn defers the render)."""
    renderer = Renderer()
    pipeline.content = Content(pool=None, renderer=renderer, turn_wait_s=0.001)  # type: ignore[arg-type]
    return renderer


async def test_a_row_deferred_max_times_is_dead_at_its_next_deferral_and_its_neighbours_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worn, under, other = row("b-worn", tenant_id="t-b", deferrals=MAX), row("b-under", tenant_id="t-b", deferrals=MAX - 1), row("a-1", tenant_id="t-a")  # fmt: skip
    rows = [worn, under, other]
    addresses = {r.id: [Address(f"+1415555000{i}")] for i, r in enumerate(rows)}
    pipeline, provider, messages = build(monkeypatch, rows, addresses, max_deferrals=MAX)
    renderer = deferring(pipeline)

    counted = deferrals_counted()
    async with turn_held(renderer, "t-b"):
        outcomes = by_event(rows, await pipeline.process(messages))

    # By tenant: the alerts on this series name the tenant whose renders are too slow.
    assert deferrals_counted() - counted == Counter({("t-b", "dead"): 1, ("t-b", "deferred"): 1})
    dead = outcomes["b-worn"]
    assert (dead.status, dead.error_code, dead.calls, dead.not_before) == ("dead", TOO_OFTEN, 0, None)
    assert dead.detail == f"dead after {MAX} render deferrals (CLARION_MAX_RENDER_DEFERRALS)"
    delayed = outcomes["b-under"]
    assert (delayed.status, delayed.error_code) == ("delayed", RENDER_DEFERRED)
    assert delayed.not_before is not None
    assert outcomes["a-1"].status == "sent"
    assert [m.to for m in provider.sent] == ["+14155550002"]


async def test_a_row_at_the_bound_whose_turn_comes_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound ends a row at a deferral past it, never a row that can render now."""
    worn = row("b-worn", tenant_id="t-b", deferrals=MAX)
    pipeline, provider, messages = build(monkeypatch, [worn], {worn.id: [Address("+14155550001")]}, max_deferrals=MAX)  # fmt: skip
    deferring(pipeline)
    [outcome] = await pipeline.process(messages)
    assert outcome.status == "sent"
    assert [m.to for m in provider.sent] == ["+14155550001"]


class OneConnection:
    """A pool every connection of which is ``conn``: the steps run in the test's transaction."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        yield self.conn


def pipeline_on(conn: asyncpg.Connection, provider: Recording) -> tuple[Pipeline, Renderer]:
    pool = cast(asyncpg.Pool, OneConnection(conn))
    renderer = Renderer()
    sender = Sender(
        channel=Channel.sms,
        pool=pool,
        providers=ProviderSet(routes={(Channel.sms, None): provider}),
        policy=RetryPolicy(),
    )
    pipeline = Pipeline(
        channel=Channel.sms,
        pool=pool,
        content=Content(pool=pool, renderer=renderer, turn_wait_s=0.001),
        sender=sender,
        policy=RetryPolicy(),
        lease_s=30.0,
        concurrency=1,
        max_deferrals=MAX,
    )
    return pipeline, renderer


async def message_of(conn: asyncpg.Connection, nid: UUID) -> NotificationMessage:
    """The Kafka message the relay would publish for notification ``nid``."""
    fields = await conn.fetchrow(
        "SELECT id, tenant_id, channel, user_id FROM notifications WHERE id = $1", nid
    )
    return NotificationMessage.model_validate(dict(fields))


async def accepted_held_back(client: httpx.AsyncClient) -> UUID:
    """A send accepted over the API and held back, so that only the test's pipeline takes it."""
    accepted = await client.post("/v1/notifications", json=sms_send(send_at=held_back()))
    assert accepted.status_code == 202, accepted.text
    return UUID(accepted.json()["id"])


async def deliver_due(pipeline: Pipeline, conn: asyncpg.Connection, message: NotificationMessage) -> str:
    """Make the notification due (inside the transaction, ``now()`` is its start), claim it, take it
    to an outcome and record it; its status after."""
    await conn.execute(
        "UPDATE notifications SET not_before = now() - interval '1 second' WHERE id = $1", message.id
    )
    outcomes = await pipeline.process([message])
    assert len(outcomes) == 1, "claimed"
    await pipeline.record(outcomes)
    return str(await conn.fetchval("SELECT status FROM notifications WHERE id = $1", message.id))


async def test_on_the_log_a_row_is_deferred_max_times_then_dead_with_the_reason_in_its_history(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    nid = await accepted_held_back(client)
    provider = Recording()
    async with pool.acquire() as conn:
        message = await message_of(conn, nid)
        async with conn.transaction():  # no relay or worker sees the row until it is dead
            pipeline, renderer = pipeline_on(conn, provider)
            async with turn_held(renderer, message.tenant_id):
                statuses = [await deliver_due(pipeline, conn, message) for _ in range(MAX + 1)]
            deferrals = await conn.fetchval("SELECT deferrals FROM notifications WHERE id = $1", nid)
    assert statuses == ["delayed"] * MAX + ["dead"]
    assert deferrals == MAX
    assert provider.sent == []

    shown = (await client.get(f"/v1/notifications/{nid}")).json()
    assert shown["status"] == "dead"
    assert shown["error"]["code"] == TOO_OFTEN
    assert f"deferred {MAX} times" in shown["error"]["message"]
    details = [h["detail"] for h in shown["history"] if h["status"] in ("delayed", "dead")]
    assert details == ["render deferred to a later batch"] * MAX + [
        f"dead after {MAX} render deferrals (CLARION_MAX_RENDER_DEFERRALS)"
    ]


async def test_on_the_log_a_row_deferred_under_the_bound_is_sent_when_its_turn_comes(
    pool: asyncpg.Pool, client: httpx.AsyncClient
) -> None:
    nid = await accepted_held_back(client)
    provider = Recording()
    async with pool.acquire() as conn:
        message = await message_of(conn, nid)
        async with conn.transaction():
            pipeline, renderer = pipeline_on(conn, provider)
            async with turn_held(renderer, message.tenant_id):
                statuses = [await deliver_due(pipeline, conn, message) for _ in range(MAX)]
            statuses.append(await deliver_due(pipeline, conn, message))
    assert statuses == ["delayed"] * MAX + ["sent"]
    assert len(provider.sent) == 1
    assert (await client.get(f"/v1/notifications/{nid}")).json()["status"] == "sent"
