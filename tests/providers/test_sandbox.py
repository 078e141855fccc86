"""The sandbox provider stores concurrent sends together, and a row it cannot store fails alone."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.sandbox_store import PgSandboxStore
from providers.base import RenderedMessage
from providers.sandbox import SandboxProvider
from schema.enums import Channel
from schema.ids import uuid7
from tests.conftest import TenantInfo


def message(tenant_id: str, body: str) -> RenderedMessage:
    return RenderedMessage(
        notification_id=uuid7(), tenant_id=tenant_id, channel=Channel.email, to="ada@example.com",
        body=body, subject="Hi", data={"body": body, "quote": '"\\'},
    )  # fmt: skip


async def stored_bodies(engine: AsyncEngine, tenant_id: str) -> list[str]:
    """The bodies stored for ``tenant_id``, each checked against the data stored beside it."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text("SELECT body, data FROM sandbox_messages WHERE tenant_id = :t ORDER BY body"),
            {"t": tenant_id},
        )
        stored = list(rows)
    assert all(data == {"body": body, "quote": '"\\'} for body, data in stored)
    return [body for body, _ in stored]


async def test_concurrent_sends_are_all_stored_with_their_own_ids(
    engine: AsyncEngine, tenant: TenantInfo
) -> None:
    sandbox = SandboxProvider(PgSandboxStore(engine.url.render_as_string(hide_password=False)))
    try:
        results = await asyncio.gather(*(sandbox.send(message(tenant.id, f"b{i:02}")) for i in range(40)))
    finally:
        await sandbox.aclose()
    assert len({r.provider_message_id for r in results}) == 40
    assert await stored_bodies(engine, tenant.id) == [f"b{i:02}" for i in range(40)]


async def test_a_row_the_database_refuses_fails_alone(engine: AsyncEngine, tenant: TenantInfo) -> None:
    sandbox = SandboxProvider(PgSandboxStore(engine.url.render_as_string(hide_password=False)))
    bodies = [f"ok{i}" for i in range(9)] + ["nul\x00byte"]
    try:
        results = await asyncio.gather(
            *(sandbox.send(message(tenant.id, b)) for b in bodies), return_exceptions=True
        )
    finally:
        await sandbox.aclose()
    assert [isinstance(r, Exception) for r in results] == [False] * 9 + [True]
    assert await stored_bodies(engine, tenant.id) == sorted(bodies[:9])
