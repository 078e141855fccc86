"""Scenario 6, backlog isolation: 100,000 ``bulk`` emails queued, then ``critical`` sends.

The backlog is a bulk import: 100,000 rows written straight into the log as ``accepted``
(PostgreSQL COPY, 1,000 recipients) and published by the outbox relay to the bulk lane
(``notifications.email.bulk``, its own consumer group), exactly as the relay publishes anything
the API did not. Loading it through the API would take minutes on this machine and measure the
API, not the lanes. Once it is on the broker and draining, ``critical`` sends from another tenant
arrive through the API at a steady rate. Expected: critical p99 accept (row committed) to
provider (sandbox row committed) under 500 ms while the backlog is still there, and 0 lost.

"On the broker and draining" means 90% published, or a quarter of the backlog published and not
yet delivered, whichever comes first: the workers drain while the relay publishes, and once they
drained fast enough to finish the backlog before the critical sends did, waiting for 90% left
nothing to be isolated from. Starting at a quarter means the relay may still be publishing the
rest while the first critical sends arrive, which only makes it harder for them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from chaos.reconcile import reconcile
from chaos.report import Result
from chaos.scenarios.common import scaled, settle, start_load
from chaos.stack import TERMINAL, Stack, StackOptions
from schema.ids import uuid7

FULL = 100_000
RECIPIENTS = 1_000
P99_LIMIT_S = 0.5
NOTIFICATION_COLUMNS = [
    "id", "tenant_id", "event_id", "request_hash", "user_id", "channel", "category", "priority",
    "content", "data", "status", "history", "attempts", "created_at", "updated_at",
]  # fmt: skip


async def import_backlog(stack: Stack, count: int) -> float:
    """Write ``count`` accepted bulk emails into the log; returns the seconds it took."""
    started = time.monotonic()
    conn = await asyncpg.connect(stack.dsn)
    try:
        users = [
            (uuid7(), stack.tenant_id, f"bulk-u{i}", f"bulk{i}@chaos.example.com") for i in range(RECIPIENTS)
        ]
        await conn.copy_records_to_table(
            "users", records=users, columns=["id", "tenant_id", "external_id", "email"]
        )
        past = datetime.now(UTC) - timedelta(seconds=10)  # past the relay's grace period
        history = json.dumps([{"status": "accepted", "at": past.isoformat(), "detail": "bulk import"}])
        content = json.dumps({"subject": "Spring sale {{ n }}", "body": "Everything must go ({{ n }})"})
        records = [
            (uuid7(), stack.tenant_id, f"bulk-{i}", hashlib.sha256(f"bulk-{i}".encode()).hexdigest(),
             users[i % RECIPIENTS][0], "email", "marketing", "bulk", content, json.dumps({"n": i}),
             "accepted", history, 0, past, past)
            for i in range(count)
        ]  # fmt: skip
        # COPY speaks binary; jsonb's binary form is a version byte (1) and the JSON text.
        await conn.set_type_codec(
            "jsonb",
            encoder=lambda text: b"\x01" + text.encode(),
            decoder=lambda raw: json.loads(raw[1:]),
            schema="pg_catalog",
            format="binary",
        )
        for i in range(0, count, 20_000):
            await conn.copy_records_to_table(
                "notifications", records=records[i : i + 20_000], columns=NOTIFICATION_COLUMNS
            )
    finally:
        await conn.close()
    return time.monotonic() - started


async def progress(stack: Stack) -> tuple[int, int]:
    """(published, final) counts of the backlog."""
    conn = await asyncpg.connect(stack.dsn)
    try:
        row = await conn.fetchrow(
            """SELECT count(*) FILTER (WHERE published_at IS NOT NULL) AS published,
                      count(*) FILTER (WHERE status = ANY($2::text[])) AS final
                 FROM notifications WHERE tenant_id = $1""",
            stack.tenant_id,
            list(TERMINAL),
        )
        return int(row["published"]), int(row["final"])
    finally:
        await conn.close()


async def run(
    scale: float, log_dir: Path, *, critical_rate: float = 20.0, critical_s: float = 20.0
) -> Result:
    count = scaled(FULL, scale, minimum=2000)
    critical = int(critical_rate * critical_s)
    result = Result("6 backlog isolation", count + critical)
    async with Stack(StackOptions(channels=("email",), relay_stale_queued_s=300.0), log_dir) as stack:
        key = await stack.make_tenant("critical")
        imported_in_s = await import_backlog(stack, count)
        published_at = time.monotonic()
        published, final = await progress(stack)
        while time.monotonic() - published_at < 120:
            if published >= count * 0.9 or published - final >= count * 0.25:
                break
            await asyncio.sleep(0.5)
            published, final = await progress(stack)
        published_in_s = time.monotonic() - published_at  # to the first critical send
        backlog_at_start = await stack.pending()
        urgent = start_load(
            stack, count=critical, mix="email=1", priority="critical", rate=critical_rate,
            concurrency=8, key=key, name="critical",
        )  # fmt: skip
        await urgent.wait(critical_s + 120)
        backlog_at_end = await stack.pending()
        urgent_rec = await settle(stack, result, [urgent], drain_s=60, tenant_id="critical")
        drained_in_s = await stack.drain(900)
        bulk_rec = await reconcile(
            dsn=stack.dsn, tenant_id=stack.tenant_id, accepted={}, ledgers={}, lease_s=stack.options.lease_s
        )
        result.accepted += count
        result.sent += bulk_rec.sent
        result.lost += bulk_rec.lost
        result.duplicates += bulk_rec.duplicates
        result.duplicate_rate = result.duplicates / result.sent if result.sent else 0.0
        p99 = urgent_rec.latency(0.99)
        result.figures.update(
            backlog_imported_in_s=round(imported_in_s, 1),
            critical_started_after_s=round(published_in_s, 1),
            backlog_published_when_critical_started=published,
            backlog_on_broker_when_critical_started=published - final,
            backlog_when_critical_started=backlog_at_start,
            backlog_when_critical_ended=backlog_at_end,
            backlog_drained_in_s=round(drained_in_s, 1),
            critical_p50_s=urgent_rec.latency(0.5),
            critical_p99_s=p99,
            critical_max_s=urgent_rec.latency(1.0),
            bulk=bulk_rec.figures(),
        )
        result.max_latency_s = urgent_rec.latency(1.0)
        result.check(p99 is not None and p99 < P99_LIMIT_S, f"critical p99 {_ms(p99)} >= {_ms(P99_LIMIT_S)}")
        result.check(backlog_at_end > 0, "the bulk backlog was gone before the critical sends ended")
        result.check(urgent_rec.sent == critical, f"critical sent {urgent_rec.sent} of {critical}")
        result.check(bulk_rec.sent == count and bulk_rec.lost == 0, f"bulk sent {bulk_rec.sent} of {count}")
        stages = urgent_rec.figures()["stages_p50_p99_s"]
        result.notes.append(
            f"{critical} critical at {critical_rate:g}/s behind {backlog_at_start:,} queued bulk "
            f"({published - final:,} of them on the broker; {backlog_at_end:,} left after): critical p50 {_ms(urgent_rec.latency(0.5))}, p99 {_ms(p99)} "
            f"(p99 publish {_ms(stages['publish'][1])}, consume {_ms(stages['consume'][1])}, "
            f"send {_ms(stages['send'][1])}); backlog drained {drained_in_s:.0f} s later; "
            "max latency column = critical"
        )
    return result


def _ms(value: float | None) -> str:
    return f"{value * 1000:.0f} ms" if value is not None else "-"
