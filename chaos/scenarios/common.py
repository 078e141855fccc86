"""What every scenario does: run load from a separate process, drain, reconcile, judge."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos.procs import Proc
from chaos.reconcile import Reconciliation, read_accepted, reconcile
from chaos.report import Result
from chaos.stack import Stack


@dataclass
class LoadRun:
    proc: Proc
    out: Path
    summary: dict[str, Any] | None = None

    @property
    def done(self) -> bool:
        return not self.proc.running

    def answered(self) -> int:
        """How many sends have had their final answer so far."""
        if not self.out.exists():
            return 0
        with self.out.open("rb") as f:
            return sum(1 for _ in f)

    async def until_answered(self, n: int, timeout_s: float) -> None:
        """Wait until ``n`` sends have been answered (or the load ended, or time ran out)."""
        deadline = time.monotonic() + timeout_s
        while self.answered() < n and not self.done and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)

    async def wait(self, timeout_s: float) -> dict[str, Any]:
        """The load generator's summary once it has finished (killed after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while self.proc.running and time.monotonic() < deadline:  # noqa: ASYNC110 - polling a child
            await asyncio.sleep(0.2)
        if self.proc.running:
            self.proc.kill()
            raise TimeoutError(f"the load generator did not finish within {timeout_s}s")
        assert self.proc.popen is not None and self.proc.popen.stdout is not None
        lines = self.proc.popen.stdout.read().decode().strip().splitlines()
        self.summary = json.loads(lines[-1]) if lines else {}
        return self.summary


def start_load(
    stack: Stack,
    *,
    count: int,
    mix: str = "email=0.5,sms=0.25,push=0.25",
    priority: str = "normal",
    concurrency: int = 32,
    rate: float = 0.0,
    give_up_s: float = 120.0,
    start: int = 0,
    key: str | None = None,
    name: str = "load",
    batch: int = 0,
    request_timeout_s: float = 10.0,
) -> LoadRun:
    """Start ``chaos.load`` as its own process against the stack's API."""
    out = stack.sup.log_dir / f"{name}.jsonl"
    args = [
        "--url", stack.api_url, "--key", key or stack.key, "--count", str(count), "--start", str(start),
        "--run", f"{name}-{secrets.token_hex(3)}", "--mix", mix, "--priority", priority,
        "--concurrency", str(concurrency), "--rate", str(rate), "--give-up-s", str(give_up_s),
        "--out", str(out), "--batch", str(batch), "--request-timeout-s", str(request_timeout_s),
    ]  # fmt: skip
    proc = stack.sup.python(name, "chaos.load", *args)
    proc.stdout_pipe = True
    proc.start()
    return LoadRun(proc, out)


async def settle(
    stack: Stack, result: Result, loads: list[LoadRun], *, drain_s: float, tenant_id: str | None = None
) -> Reconciliation:
    """Drain the stack, reconcile the log with the providers, and fill ``result``'s common figures."""
    drained_in_s = await stack.drain(drain_s, tenant_id)
    accepted: dict[str, str] = {}
    for load in loads:
        accepted.update(read_accepted(load.out))
    ledgers = {kind: await fake.ledger() for kind, fake in stack.fakes.items()}
    rec = await reconcile(
        dsn=stack.dsn,
        tenant_id=tenant_id or stack.tenant_id,
        accepted=accepted,
        ledgers=ledgers,
        lease_s=stack.options.lease_s,
    )
    result.accepted += rec.accepted
    result.sent += rec.sent
    result.lost += rec.lost
    result.duplicates += rec.duplicates
    result.duplicate_rate = result.duplicates / result.sent if result.sent else 0.0
    latency = rec.latency(1.0)
    if latency is not None:
        result.max_latency_s = max(result.max_latency_s or 0.0, latency)
    result.figures["drained_in_s"] = round(drained_in_s, 1)
    result.figures["startup_s"] = dict(stack.timings)
    result.figures["reconciliation" if tenant_id is None else f"reconciliation:{tenant_id}"] = rec.figures()
    result.figures["load"] = [load.summary for load in loads]
    for kind, ledger in ledgers.items():
        result.figures[f"{kind}_statuses"] = ledger.get("statuses")
    result.check(not rec.missing, f"{len(rec.missing)} accepted notifications missing from the log")
    result.check(not rec.stuck, f"{len(rec.stuck)} notifications not final after {drain_s:.0f}s")
    result.check(not rec.sent_without_call, f"{len(rec.sent_without_call)} 'sent' with no provider call")
    unexplained = rec.duplicates - rec.duplicates_explained
    result.check(unexplained == 0, f"{unexplained} duplicates not explained by an expired lease")
    return rec


def scaled(full: int, scale: float, minimum: int = 50) -> int:
    return max(minimum, int(full * scale))
