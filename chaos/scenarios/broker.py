"""Scenario 2, broker loss: the broker dies mid-load and a fresh, empty one takes its place.

Tansu keeps everything in memory, so the replacement has no topics, no messages and no committed
offsets. The API keeps accepting (rows stay ``accepted`` while the outbox cannot publish); the
operator runs ``clarion topics create`` against the new broker; the relay republishes from the log
(``accepted`` past the grace period, ``queued`` past ``relay_stale_queued_s``). Expected: 0 lost.
"""

from __future__ import annotations

import asyncio
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
        killed_at = time.monotonic()
        stack.broker.stop()  # SIGKILL: memory storage, everything it held is gone
        await asyncio.sleep(outage_s)
        await asyncio.to_thread(stack.broker.start)
        await stack.create_topics()
        back_in_s = time.monotonic() - killed_at
        await load.wait(600)
        rec = await settle(stack, result, [load], drain_s=180)
        republished = await stack.scrape("relay", "clarion_relay_republished_total")
        result.figures.update(outage_s=round(back_in_s, 1), relay_republished=republished)
        result.notes.append(
            f"broker down {back_in_s:.1f} s, came back empty; relay republished "
            f"{int(sum(republished.values())):,}; drained {result.figures['drained_in_s']} s after load"
        )
        result.check(rec.sent == count, f"sent {rec.sent} of {count}")
        result.check(sum(republished.values()) > 0, "the relay republished nothing")
    return result
