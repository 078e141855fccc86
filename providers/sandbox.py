"""The sandbox provider: records what would have been sent, never sends.

Every message lands in the ``sandbox_messages`` table, so the API (any process) can show it at
``GET /v1/sandbox/messages``.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.coalesce import Coalescer
from clarion.pg import create_pool
from providers.base import RenderedMessage, SendResult
from schema.enums import Channel
from schema.ids import uuid7

INSERT = """
INSERT INTO sandbox_messages (notification_id, tenant_id, channel, recipient, subject, body, html, data,
                              provider_message_id)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
"""


class SandboxProvider:
    """Accepts every message for any channel and stores it; the message id is ``sbx-<uuid7>``.

    It writes with a small asyncpg pool of its own, opened on the first send. Concurrent sends are
    stored together (one ``executemany`` per batch, through a :class:`Coalescer`): the sandbox is
    the delivery target of `clarion dev` and the end-to-end benchmark, so it should cost what a
    remote provider's HTTP call costs the worker, not a database round trip per message. A send
    returns once its row is committed.
    """

    name: ClassVar[str] = "sandbox"
    channel: ClassVar[Channel] = Channel.email  # serves every channel; the attribute names the default

    def __init__(self, engine: AsyncEngine, *, pool_size: int = 4) -> None:
        self._engine = engine  # only its URL is used, when the first send opens the pool
        self._pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()
        self._writes: Coalescer[tuple[object, ...], None] = Coalescer(
            self._store, max_batch=500, max_in_flight=pool_size, name="clarion-sandbox"
        )

    async def _get_pool(self) -> asyncpg.Pool:
        async with self._opening:
            if self._pool is None:
                dsn = self._engine.url.render_as_string(hide_password=False)
                self._pool = await create_pool(dsn, size=self._pool_size)
            return self._pool

    async def send(self, message: RenderedMessage) -> SendResult:
        """Store the message; it is never sent anywhere."""
        message_id = f"sbx-{uuid7()}"
        data = dict(message.data)
        if message.unsubscribe_url:
            data["unsubscribe_url"] = message.unsubscribe_url
        await self._writes.submit(
            (
                message.notification_id, message.tenant_id, message.channel.value, message.to,
                message.subject, message.body, message.html, data, message_id,
            )
        )  # fmt: skip
        return SendResult(provider=self.name, provider_message_id=message_id)

    async def _store(self, rows: list[tuple[object, ...]]) -> list[Exception | None]:
        """Insert the batch at once; if that fails, row by row, so one bad row fails alone."""
        pool = self._pool or await self._get_pool()
        try:
            await pool.executemany(INSERT, rows)  # atomic: all rows or none
            return [None] * len(rows)
        except Exception:
            if len(rows) == 1:
                raise
        results: list[Exception | None] = []
        for row in rows:
            try:
                await pool.execute(INSERT, *row)
                results.append(None)
            except Exception as exc:
                results.append(exc)
        return results

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()
