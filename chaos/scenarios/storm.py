"""Scenario 4, provider storm: SendGrid answers 30% 5xx, 5% 429 with Retry-After, 2% timeouts.

Email goes through the SendGrid fake (two worker replicas, limiter state shared on Redis) with:
a ``provider`` pacing rule (``PACE_PER_S`` calls per second to SendGrid, plus ``BURST``), and
breakers that judge a 5 s window (open at 30% transient failures, 3 s cool-down) so the storm
visibly opens and closes them. A forced timeout hangs past the client's 1 s timeout and then
answers 504: nothing is delivered by a call the client gave up on, so every count reconciles.

The sustained 5% of 429s keep Clarion's adaptive pacing near its floor (each 429 halves the pace,
recovery needs 5 s without one), so the storm drains slowly: hence 1,000 notifications.

Expected: every notification ends ``sent`` or ``dead`` (``dead`` after 8 failed calls: with a
37% failure rate about 0.04% of them); the fake accepted exactly one call per
``sent`` notification and none for a ``dead`` one; the log's attempt rows match the calls the
fake saw, per notification; each breaker was seen open and then closed again; and in no
wall-clock second did SendGrid receive more calls than the pacing rule allows.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg

from chaos.report import Result
from chaos.scenarios.common import scaled, settle, start_load
from chaos.stack import Stack, StackOptions

FULL = 1_000
MAX_ATTEMPTS = 8  # CLARION_RETRY__MAX_ATTEMPTS (default): then dead
PACE_PER_S = 100
BURST = 10
STORM = {"p5xx": 0.30, "p429": 0.05, "ptimeout": 0.02, "timeout_s": 3.0, "retry_after_s": 1.0}
SETTINGS = {
    "CLARION_PROVIDERS__SENDGRID__TIMEOUT_S": "1",
    "CLARION_RETRY__ATTEMPT_TIMEOUT_S": "1",
    "CLARION_RETRY__RETRY_BASE_S": "1",
    "CLARION_RETRY__RETRY_MAX_S": "20",
    "CLARION_RETRY__HOLD_MAX_S": "2",
    "CLARION_RETRY__BREAKER__FAILURE_RATE": "0.3",
    "CLARION_RETRY__BREAKER__WINDOW_S": "5",
    "CLARION_RETRY__BREAKER__MIN_CALLS": "20",
    "CLARION_RETRY__BREAKER__COOL_DOWN_S": "3",
}
ATTEMPTS = """
SELECT a.notification_id::text AS id, count(*) AS calls
  FROM delivery_attempts a JOIN notifications n ON n.id = a.notification_id
 WHERE n.tenant_id = $1 GROUP BY a.notification_id
"""

IDS = "SELECT id::text AS id FROM notifications WHERE tenant_id = $1"
DETAIL = """
SELECT attempt, outcome, error_code, http_status, started_at::text, finished_at::text
  FROM delivery_attempts WHERE notification_id = $1::uuid ORDER BY attempt
"""


def calls_seen(ledger: dict[str, Any], nid: str) -> int:
    """Calls the fake answered for ``nid`` (accepted or refused)."""
    return int(ledger["accepted"].get(nid, 0)) + int(ledger["refused"].get(nid, 0))


async def _watch_breakers(stack: Stack, stop: asyncio.Event) -> dict[str, list[int]]:
    """Each email worker's sendgrid breaker state over time (0 closed, 1 half-open, 2 open)."""
    seen: dict[str, list[int]] = {name: [] for name in stack.metrics_ports if name.startswith("worker-")}
    while not stop.is_set():
        for name, states in seen.items():
            for labels, value in (await stack.scrape(name, "clarion_breaker_state")).items():
                if 'provider="sendgrid"' in labels and (not states or states[-1] != int(value)):
                    states.append(int(value))
        await asyncio.sleep(0.2)
    return seen


async def run(scale: float, log_dir: Path) -> Result:
    count = scaled(FULL, scale)
    result = Result("4 provider storm", count)
    options = StackOptions(
        channels=("email",), redis=True, sendgrid=True, storm=dict(STORM), env=dict(SETTINGS), lease_s=10.0
    )
    async with Stack(options, log_dir) as stack:
        rule = {"name": "sendgrid-pace", "scope": "provider", "provider": "sendgrid", "channel": "email",
                "limit": PACE_PER_S, "period_s": 1, "burst": BURST}  # fmt: skip
        status, body, _ = await stack.call("POST", "/v1/rate-limits", json_body=rule)
        if status != 201:
            raise RuntimeError(f"pacing rule refused: {status} {body}")
        await asyncio.sleep(3.0)  # rules reach every process within clarion.rules.REFRESH_TTL_S
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch_breakers(stack, stop))
        started = time.monotonic()
        load = start_load(stack, count=count, mix="email=1", concurrency=16)
        await load.wait(600)
        rec = await settle(stack, result, [load], drain_s=300)
        stop.set()
        breakers = await watcher
        ledger = await stack.fakes["sendgrid"].ledger()
        conn = await asyncpg.connect(stack.dsn)
        try:
            logged = {r["id"]: int(r["calls"]) for r in await conn.fetch(ATTEMPTS, stack.tenant_id)}
            ids = {r["id"] for r in await conn.fetch(IDS, stack.tenant_id)}
            mismatched = [nid for nid in ids if logged.get(nid, 0) != calls_seen(ledger, nid)]
            examples = [
                {"id": nid, "fake": [ledger["accepted"].get(nid, 0), ledger["refused"].get(nid, 0)],
                 "attempts": [dict(r) for r in await conn.fetch(DETAIL, nid)]}
                for nid in mismatched[:5]
            ]  # fmt: skip
        finally:
            await conn.close()
        seen_calls = Counter({nid: calls_seen(ledger, nid) for nid in ids})
        per_second = ledger["per_second"]
        peak = max((int(v) for v in per_second.values()), default=0)
        allowed_peak = PACE_PER_S + BURST + 1
        opened_and_closed = {
            name: 2 in states and 0 in states[states.index(2) :] for name, states in breakers.items()
        }
        statuses = rec.statuses
        result.figures.update(
            storm=STORM,
            settings=SETTINGS,
            provider_statuses=ledger["statuses"],
            provider_calls_total=sum(seen_calls.values()),
            attempt_rows_total=sum(logged.values()),
            attempt_rows_mismatched=len(mismatched),
            mismatch_examples=examples,
            peak_calls_per_s=peak,
            pacing_allows_per_s=allowed_peak,
            breaker_states=breakers,
            elapsed_s=round(time.monotonic() - started, 1),
        )
        result.check(set(statuses) <= {"sent", "dead"}, f"statuses other than sent/dead: {dict(statuses)}")
        result.check(
            statuses.get("sent", 0) + statuses.get("dead", 0) == count, "not every notification is final"
        )
        result.check(rec.duplicates == 0, f"{rec.duplicates} notifications delivered more than once")
        result.check(not rec.delivered_not_sent, f"{len(rec.delivered_not_sent)} delivered but not 'sent'")
        result.check(not mismatched, f"{len(mismatched)} notifications whose attempt rows != provider calls")
        result.check(
            all(opened_and_closed.values()), f"breakers not seen open then closed: {opened_and_closed}"
        )
        result.check(
            peak <= allowed_peak, f"SendGrid saw {peak} calls in one second; pacing allows {allowed_peak}"
        )
        fail = STORM["p5xx"] + STORM["p429"] + STORM["ptimeout"]
        expected_dead = count * fail**MAX_ATTEMPTS
        expected_calls = count * (1 - fail**MAX_ATTEMPTS) / (1 - fail)
        result.figures.update(expected_dead=round(expected_dead, 2), expected_calls=round(expected_calls))
        result.notes.append(
            f"{statuses.get('sent', 0):,} sent, {statuses.get('dead', 0):,} dead (expected "
            f"{expected_dead:.1f}); {sum(seen_calls.values()):,} provider calls for {count:,} notifications "
            f"(expected {expected_calls:,.0f}), attempt rows = calls for each; "
            f"breakers open->closed: {sum(opened_and_closed.values())}/{len(opened_and_closed)}; "
            f"peak {peak} calls/s vs pacing {PACE_PER_S}/s + burst {BURST}"
        )
    return result
