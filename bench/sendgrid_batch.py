"""How long one large SendGrid Event Webhook batch takes to record, and how long each of its chunks
holds its emails' rows: ``api.sendgrid_events.record_sendgrid_events`` called directly (no HTTP).

    .venv/bin/python -m bench.sendgrid_batch [--emails 1000] [--opens 25] [--endpoint]

A fresh database with ``--emails`` sent emails of one tenant (with ``--endpoint``, the tenant has a
webhook endpoint subscribed to ``notification.opened``, so each counted open is also a webhook
event and a delivery); a signed batch of ``--opens`` distinct opens of each email (the default is
25,000 events, 4 MB: more than the API takes in one body now, 1 MiB, but the batch the cost of
recording was first measured on), recorded once (every open new) and again (SendGrid's retry:
every open a duplicate). Prints the batch's bytes and, per pass, the wall time, its chunks' count
and the longest chunk's transaction (what another writer of those rows may wait for).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

import api.sendgrid_events as sendgrid_events
from api.callback_gate import CallbackGate
from clarion.pg import asyncpg_dsn, create_pool
from harness.fakes.sendgrid import FakeSendGrid
from harness.services import drop_database, fresh_database
from schema.ids import uuid7

TENANT = "t-bench"


async def _seed(conn: asyncpg.Connection, *, emails: int, endpoint: bool) -> list[str]:
    await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, $1)", TENANT)
    user = await conn.fetchval(
        "INSERT INTO users (id, tenant_id, external_id, email) VALUES"
        " (gen_random_uuid(), $1, 'u-1', 'u1@example.com') RETURNING id",
        TENANT,
    )
    ids = [uuid7() for _ in range(emails)]
    await conn.executemany(
        "INSERT INTO notifications (id, tenant_id, event_id, request_hash, user_id, channel, category,"
        " priority, data, status, attempts, provider, history)"
        " VALUES ($1, $2, $3, 'x', $4, 'email', 'orders', 'normal', '{}', 'sent', 1, 'sendgrid', '[]')",
        [(n, TENANT, f"e-{n}", user) for n in ids],
    )
    if endpoint:
        await conn.execute(
            "INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, secret)"
            " VALUES (gen_random_uuid(), $1, 'https://hooks.example/x', ARRAY['notification.opened'], 's')",
            TENANT,
        )
    return [str(n) for n in ids]


def _batch(emails: list[str], opens: int) -> bytes:
    now = int(time.time())
    events: list[dict[str, Any]] = [
        {
            "email": "u1@example.com",
            "timestamp": now - i,
            "event": "open",
            "sg_event_id": secrets.token_urlsafe(16),
            "notification_id": nid,
        }
        for nid in emails
        for i in range(opens)
    ]
    return json.dumps(events).encode()


def _timed_chunks(chunk_s: list[float]) -> Callable[..., Awaitable[Any]]:
    record_chunk = sendgrid_events._record_chunk

    async def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await record_chunk(*args, **kwargs)
        finally:
            chunk_s.append(time.perf_counter() - start)

    return timed


async def main(*, emails: int, opens: int, endpoint: bool) -> None:
    url = await fresh_database("clarion_bench_sgbatch")
    pool = await create_pool(url, size=4)
    try:
        conn = await asyncpg.connect(asyncpg_dsn(url))
        try:
            ids = await _seed(conn, emails=emails, endpoint=endpoint)
        finally:
            await conn.close()
        sendgrid = FakeSendGrid()
        payload = _batch(ids, opens)
        print(
            f"batch: {emails} emails x {opens} opens = {emails * opens} events, {len(payload) / 1e6:.1f} MB"
        )
        gate = CallbackGate.build(pool_size=20, sendgrid_wait_s=60)
        for label in ("first", "replay"):
            chunk_s: list[float] = []
            sendgrid_events._record_chunk = _timed_chunks(chunk_s)  # type: ignore[assignment]
            headers = sendgrid.signed_headers(payload)
            start = time.perf_counter()
            result = await sendgrid_events.record_sendgrid_events(
                pool=pool, gate=gate, public_key=sendgrid.public_key, payload=payload,
                signature=headers["X-Twilio-Email-Event-Webhook-Signature"],
                timestamp=headers["X-Twilio-Email-Event-Webhook-Timestamp"],
            )  # fmt: skip
            total_s = time.perf_counter() - start
            print(
                f"{label:7s} {total_s:6.2f} s, {len(chunk_s)} chunks, longest {max(chunk_s) * 1000:6.0f} ms,"
                f" mean {sum(chunk_s) / len(chunk_s) * 1000:5.0f} ms; recorded {result.recorded},"
                f" duplicate {result.duplicate}, ignored {result.ignored}"
            )
    finally:
        await pool.close()
        await drop_database(url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--emails", type=int, default=1000)
    parser.add_argument("--opens", type=int, default=25)
    parser.add_argument("--endpoint", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(emails=args.emails, opens=args.opens, endpoint=args.endpoint))
