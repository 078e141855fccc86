"""Scenario 7, graceful shutdown: SIGTERM each process in turn under load, then start it again.

The API (the load generator retries what got no answer, with the same event_id), each worker
replica, and the relay. A process asked to stop must exit on its own within ``stop_bound_s``
(exit code 0, no SIGKILL needed), having finished its in-flight work or handed it back:
expected 0 lost and 0 duplicates. Notifications a stopping worker claimed but did not record are
counted (``reclaimed_after_lease_expiry``): those waited a lease instead of being handed back.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from chaos.procs import Proc
from chaos.report import Result
from chaos.scenarios.common import scaled, settle, start_load
from chaos.stack import Stack, StackOptions
from clarion.ports import wait_listening

FULL = 5_000


async def _stop(proc: Proc, bound_s: float) -> tuple[float, int | None]:
    started = time.monotonic()
    code = await asyncio.to_thread(proc.stop, bound_s)
    return time.monotonic() - started, code


async def run(scale: float, log_dir: Path, *, stop_bound_s: float = 30.0) -> Result:
    count = scaled(FULL, scale)
    result = Result("7 graceful shutdown (SIGTERM)", count)
    async with Stack(StackOptions(), log_dir) as stack:
        load = start_load(stack, count=count, give_up_s=180)
        assert stack.api is not None and stack.relay is not None
        victims = [stack.api, *[w for ch in stack.options.channels for w in stack.workers[ch]], stack.relay]
        stops: dict[str, dict[str, float | int | None]] = {}
        step = max(count // (len(victims) + 2), 1)
        for n, proc in enumerate(victims, start=1):
            await load.until_answered(step * n, 300)
            took_s, code = await _stop(proc, stop_bound_s)
            stops[proc.name] = {"exit_code": code, "stop_s": round(took_s, 2)}
            result.check(code == 0, f"{proc.name} exited with {code} after SIGTERM")
            result.check(took_s < stop_bound_s, f"{proc.name} took {took_s:.1f}s to stop")
            proc.start()
            if proc is stack.api:
                await asyncio.to_thread(wait_listening, stack.api_port, 60, proc.popen)
        await load.wait(600)
        rec = await settle(stack, result, [load], drain_s=120)
        result.figures["stops"] = stops
        slowest = max(stops.items(), key=lambda kv: float(kv[1]["stop_s"] or 0))
        result.notes.append(
            f"{len(stops)} SIGTERMs, all exit 0: {all(s['exit_code'] == 0 for s in stops.values())}; "
            f"slowest stop {slowest[0]} {slowest[1]['stop_s']} s; "
            f"{rec.reclaimed} claims left to lease expiry"
        )
        result.check(rec.sent == count, f"sent {rec.sent} of {count}")
        result.check(rec.duplicates == 0, f"{rec.duplicates} provider duplicates after graceful stops")
    return result
