"""Scenario 1, worker crash: SIGKILL a worker replica every few seconds under load, restart it.

20,000 notifications (email through the SendGrid fake, SMS and push through the sandbox) while
one worker process after another (two email replicas in one consumer group, the SMS and the push
worker) is killed with SIGKILL and restarted. Expected: every notification final, 0 lost; provider
duplicates counted, and each one explained by the lease window (the killed worker had called the
provider but not recorded the outcome; the claim was taken again once its lease expired).

The SendGrid fake answers each call after ``SENDGRID_LATENCY_S`` (a real API's pace: a batch's
calls then spread over a second or more, as they do in production), the sandbox at once (SMS and
push: a 500-record batch's calls in ~0.2 s). Duplicates are counted per channel: what a kill
re-sends is about the calls of the last ~0.1-0.2 s (``workers/recording.py``), so many more at the
sandbox's pace than at a provider's.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path

from chaos.report import Result
from chaos.scenarios.common import scaled, settle, start_load
from chaos.stack import Stack, StackOptions

FULL = 20_000
SENDGRID_LATENCY_S = 0.15


async def run(
    scale: float, log_dir: Path, *, kill_every_s: float = 4.0, rate: float = 0.0, min_kills: int = 3
) -> Result:
    count = scaled(FULL, scale)
    result = Result("1 worker crash (SIGKILL)", count)
    lease_s = 10.0
    options = StackOptions(sendgrid=True, lease_s=lease_s, storm={"latency_s": SENDGRID_LATENCY_S})
    async with Stack(options, log_dir) as stack:
        load = start_load(stack, count=count, rate=rate)
        victims = itertools.cycle([w for ch in stack.options.channels for w in stack.workers[ch]])
        kills = 0
        started = time.monotonic()
        while not load.done or kills < min_kills:
            await asyncio.sleep(kill_every_s)
            victim = next(victims)
            victim.kill()
            kills += 1
            await asyncio.sleep(0.5)
            victim.start()
        await load.wait(60)
        rec = await settle(stack, result, [load], drain_s=lease_s * 4 + 120)
        result.figures.update(kills=kills, kill_every_s=kill_every_s, lease_s=lease_s)
        result.elapsed_s = round(time.monotonic() - started, 1)
        p50, p99 = (v or 0.0 for v in rec.figures()["stages_p50_p99_s"]["record"])
        by_channel = ", ".join(f"{ch} {n}" for ch, n in sorted(rec.duplicates_by_channel.items())) or "none"
        result.notes.append(
            f"{kills} SIGKILLs; {rec.duplicates_explained}/{rec.duplicates} duplicates after a lease "
            f"expiry ({lease_s:.0f} s lease; {by_channel}; SendGrid answering in "
            f"{SENDGRID_LATENCY_S * 1000:.0f} ms); a provider call unrecorded p50 {p50 * 1000:.0f} ms, "
            f"p99 {p99 * 1000:.0f} ms"
        )
        result.check(rec.sent == count, f"sent {rec.sent} of {count}")
    return result
