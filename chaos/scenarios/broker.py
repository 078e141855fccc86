"""Scenario 2, broker loss: the broker dies mid-load and a fresh, empty one takes its place.

Tansu keeps everything in memory, so the replacement has no topics, no messages and no committed
offsets. The API keeps accepting (rows stay ``accepted`` while the outbox cannot publish); the
operator runs ``clarion topics create`` against the new broker; the relay republishes from the log
(``accepted`` past the grace period, ``queued`` past ``relay_stale_queued_s``). Expected: 0 lost.

The broker dies holding messages no worker has taken yet, so the relay must bring them back: the
workers are frozen (SIGSTOP) from just before until just after the kill, once the log shows rows
the broker has acknowledged and no worker has claimed. Without the freeze the premise is luck: on a
slow machine the API had published nothing before the kill, and on a fast one the workers had
taken everything, and either way there was nothing to republish (a CI run on 2026-11-26).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

from chaos.report import Result
from chaos.scenarios.common import scaled, settle, start_load
from chaos.stack import Stack, StackOptions

FULL = 5_000


async def run(scale: float, log_dir: Path, *, outage_s: float = 5.0) -> Result:
    count = scaled(FULL, scale)
    result = Result("2 broker loss", count)
    async with Stack(StackOptions(relay_stale_queued_s=10.0), log_dir) as stack:
        load = start_load(stack, count=count)
        await load.until_answered(count // 3, 300)
        workers = [proc for procs in stack.workers.values() for proc in procs]
        for proc in workers:
            proc.signal(signal.SIGSTOP)
        in_broker = await _until_in_broker(stack, timeout_s=120)
        killed_at = time.monotonic()
        stack.broker.stop()  # SIGKILL: memory storage, everything it held is gone
        for proc in workers:
            proc.signal(signal.SIGCONT)
        await asyncio.sleep(outage_s)
        await asyncio.to_thread(stack.broker.start)
        await stack.create_topics()
        back_in_s = time.monotonic() - killed_at
        await load.wait(600)
        rec = await settle(stack, result, [load], drain_s=180)
        republished = await stack.scrape("relay", "clarion_relay_republished_total")
        result.figures.update(
            outage_s=round(back_in_s, 1), in_broker_unclaimed=in_broker, relay_republished=republished
        )
        result.notes.append(
            f"broker down {back_in_s:.1f} s, came back empty holding {in_broker} unclaimed; relay republished "
            f"{int(sum(republished.values())):,}; drained {result.figures['drained_in_s']} s after load"
        )
        result.check(rec.sent == count, f"sent {rec.sent} of {count}")
        result.check(in_broker > 0, "the broker held no unclaimed message when it died")
        result.check(sum(republished.values()) > 0, "the relay republished nothing")
    return result


async def _until_in_broker(stack: Stack, *, timeout_s: float) -> int:
    """How many of the tenant's notifications the broker has acknowledged and no worker has
    claimed, once there are any (0 if there are none within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    conn = await stack.connect()
    try:
        while True:
            unclaimed = int(
                await conn.fetchval(
                    "SELECT count(*) FROM notifications"
                    " WHERE tenant_id = $1 AND status = 'accepted' AND queued_at IS NOT NULL",
                    stack.tenant_id,
                )
            )
            if unclaimed or time.monotonic() > deadline:
                return unclaimed
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
