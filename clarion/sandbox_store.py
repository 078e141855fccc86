"""Where the sandbox provider keeps what it would have sent: the ``sandbox_messages`` table.

Concurrent sends are stored together (one ``executemany`` per batch, through a ``Coalescer``): the
sandbox is the delivery target of `clarion dev` and the end-to-end benchmark, so it should cost
what a remote provider's HTTP call costs the worker, not a database round trip per message. The
store opens a small asyncpg pool of its own on the first send.
"""

from __future__ import annotations

import asyncio

import asyncpg

from clarion.coalesce import Coalescer
from clarion.pg import create_pool
from providers.sandbox import SandboxRecord

# A batch as one statement (a row alone is a batch of one): ``executemany`` of a one-row INSERT ran
# one statement per row, 16 µs of PostgreSQL time per message under bench.e2e (pg_stat_statements,
# 2026-11-28), the sandbox's whole cost beside a provider call.
INSERT = """
INSERT INTO sandbox_messages (notification_id, tenant_id, channel, recipient, subject, body, html, data,
                              provider_message_id)
SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                     $8::jsonb[], $9::text[])
"""


class PgSandboxStore:
    """Stores sandbox messages in PostgreSQL; ``save`` returns once its row is committed."""

    def __init__(self, database_url: str, *, pool_size: int = 4) -> None:
        self._database_url = database_url
        self._pool_size = pool_size
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()
        self._writes: Coalescer[SandboxRecord, None] = Coalescer(
            self._store, max_batch=500, max_in_flight=pool_size, name="clarion-sandbox"
        )

    async def save(self, record: SandboxRecord) -> None:
        await self._writes.submit(record)

    async def _get_pool(self) -> asyncpg.Pool:
        async with self._opening:
            if self._pool is None:
                self._pool = await create_pool(self._database_url, size=self._pool_size)
            return self._pool

    async def _store(self, rows: list[SandboxRecord]) -> list[Exception | None]:
        """Insert the batch at once; if that fails, row by row, so one bad row fails alone."""
        pool = self._pool or await self._get_pool()
        try:
            await _insert(pool, rows)
            return [None] * len(rows)
        except Exception:
            if len(rows) == 1:
                raise
        results: list[Exception | None] = []
        for row in rows:
            try:
                await _insert(pool, [row])
                results.append(None)
            except Exception as exc:
                results.append(exc)
        return results

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()


async def _insert(pool: asyncpg.Pool, rows: list[SandboxRecord]) -> None:
    """``rows`` in one statement: all of them or none."""
    await pool.execute(INSERT, *(list(column) for column in zip(*rows, strict=True)))
