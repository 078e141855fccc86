"""Scenario 3, database restart: the private PostgreSQL stops mid-load and comes back.

While it is down the API must answer ``503 database_unavailable`` with ``Retry-After`` quickly
(not a 500, not a hang) and ``/readyz`` must say it is not ready; the load generator retries
with the same event_id, as a client would. Afterwards every send that got a 2xx is in the log
and is delivered: nothing is accepted without being logged. Workers hold their batch (no offset
commit) until they can record it; the relay resumes its scans.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from chaos.load import body_for
from chaos.report import Result
from chaos.scenarios.common import scaled, settle, start_load
from chaos.stack import Stack, StackOptions

FULL = 5_000


async def _probe_while_down(stack: Stack, outage_s: float) -> list[dict[str, object]]:
    """Sends and readiness checks from the orchestrator while the database is down."""
    probes: list[dict[str, object]] = []
    deadline = time.monotonic() + outage_s
    n = 0
    while time.monotonic() < deadline:
        body = body_for("probe", 800_000_000 + n, "email", "normal")
        status, document, took_s = await stack.call("POST", "/v1/notifications", json_body=body, timeout_s=15)
        code = document.get("error", {}).get("code") if isinstance(document, dict) else None
        ready, _, _ = await stack.call("GET", "/readyz", timeout_s=15)
        probes.append({"status": status, "code": code, "took_s": round(took_s, 3), "readyz": ready})
        n += 1
        await asyncio.sleep(0.5)
    return probes


async def run(scale: float, log_dir: Path, *, outage_s: float = 8.0) -> Result:
    count = scaled(FULL, scale)
    result = Result("3 database restart", count)
    async with Stack(StackOptions(), log_dir) as stack:
        load = start_load(stack, count=count, give_up_s=180)
        await load.until_answered(count // 3, 300)
        await asyncio.to_thread(stack.pg.stop, mode="fast")
        await asyncio.sleep(1.0)  # let in-flight requests finish failing; then probe
        probes = await _probe_while_down(stack, outage_s)
        await asyncio.to_thread(stack.pg.start)
        await load.wait(600)
        rec = await settle(stack, result, [load], drain_s=180)
        summary = load.summary or {}
        result.figures["probes_while_down"] = probes
        statuses = {p["status"] for p in probes}
        slowest = max((float(p["took_s"]) for p in probes), default=0.0)  # type: ignore[arg-type]
        result.check(bool(probes) and statuses == {503}, f"sends while the database was down got {statuses}")
        result.check(
            all(p["code"] == "database_unavailable" for p in probes), "a 503 without database_unavailable"
        )
        result.check(slowest < 5.0, f"a send took {slowest:.1f}s to be refused (a hang)")
        result.check(all(p["readyz"] == 503 for p in probes), "/readyz did not report 503 while down")
        errors = summary.get("error_codes", {})
        server_errors = {k: v for k, v in errors.items() if k.startswith("5") and not k.startswith("503:")}
        result.check(not server_errors, f"the load saw other 5xx: {server_errors}")
        result.check(summary.get("hangs", 0) == 0, f"{summary.get('hangs')} requests hung past 10 s")
        result.check(rec.sent == count, f"sent {rec.sent} of {count}")
        result.notes.append(
            f"down {outage_s:.0f}+1 s: {len(probes)} probes all 503 database_unavailable "
            f"(slowest {slowest:.2f} s), /readyz 503; load saw {errors}"
        )
    return result
