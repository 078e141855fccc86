"""What the relay's pacing costs a tenant's banked backlog: updates a row, and the queue's order.

    .venv/bin/python -m bench.release_queue [--rows 3000] [--limit 1] [--period-s 60]
                                            [--api-share 0.3] [--loosen-at-s 36000]

Runs the real `api.release_pacing.ReleasePacing` on the memory limiter over a simulated log: one
tenant's ``--rows`` scheduled sends all due at one instant behind an operator ``tenant`` rule of
``--limit`` per ``--period-s`` (no burst), a relay run every second (passes of 2,000 rows, further
passes skipping the tenant once held, as `api.relay` does), time jumping to the next due row when
nothing is due. ``--api-share`` is the part of the rule the tenant's immediate sends take at the
API meanwhile; ``--loosen-at-s`` makes the rule ten times faster at that time. It prints the
updates a row cost (its holds), how many rows went out before an older one, and how long after its
place in the queue the most overtaken row went (its place: the time of the n-th release for the
n-th oldest row).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from api.ingress import tenant_key
from api.release_pacing import DueRow, ReleasePacing
from clarion.rules import RulesCache
from core.ratelimit_memory import MemoryRateLimiter

T0 = datetime(2030, 1, 1, tzinfo=UTC)
BATCH = 2_000


class Rules:
    """The rules table the pacing's cache reads: one operator rule, editable."""

    def __init__(self, limit: int, period_s: float) -> None:
        self.row: dict[str, Any] = {
            "id": uuid.uuid4(), "tenant_id": None, "name": "per-tenant", "scope": "tenant",
            "channel": None, "category": None, "provider": None, "limit": limit, "period_s": period_s,
            "burst": 0, "mode": "hard", "overshoot_pct": 0.0, "action": "delay",
        }  # fmt: skip

    async def fetch(self, sql: str) -> list[dict[str, Any]]:
        return [self.row] if "rate_limit_rules" in sql else []


@dataclasses.dataclass
class Row:
    due: DueRow
    rank: int
    not_before: float = 0.0  # seconds after T0; 0 is its send_at
    updates: int = 0


async def simulate(
    *, rows: int, limit: int, period_s: float, api_share: float, loosen_at_s: float | None
) -> dict[str, float]:
    now = [0.0]
    rules = Rules(limit, period_s)
    pacing = ReleasePacing(
        RulesCache(rules.fetch, clock=lambda: now[0]),
        MemoryRateLimiter(clock=lambda: 1_000.0 + now[0]),
        clock=lambda: T0 + timedelta(seconds=now[0]),
    )
    log: dict[uuid.UUID, Row] = {}
    for rank in range(rows):
        first = DueRow(
            id=uuid.uuid4(), created_at=T0 - timedelta(days=1) + timedelta(milliseconds=rank), tenant_id="A",
            channel="email", user_id=uuid.uuid4(), priority="normal", traceparent=None, due_at=T0, paced=True,
        )  # fmt: skip
        log[first.id] = Row(first, rank)
    released: list[tuple[int, float]] = []
    updates = throttled = 0
    owed, last_run = 0.0, 0.0
    while log:
        if loosen_at_s is not None and now[0] >= loosen_at_s and rules.row["limit"] == limit:
            rules.row["limit"] = limit * 10
        if api_share:
            spec = (await pacing.rules.current()).rules[0]
            owed += api_share * (now[0] - last_run) * spec.limit / spec.period_s
            for _ in range(int(owed)):
                await pacing.limiter.acquire(tenant_key(spec, "A"), spec.to_rule(), 1)
            owed -= int(owed)
        last_run = now[0]
        while True:  # the run's passes
            due = sorted((r for r in log.values() if r.not_before <= now[0]), key=lambda r: r.rank)[:BATCH]
            if not due:
                break
            plan = await pacing.plan([r.due for r in due])
            for d in plan.release:
                released.append((log.pop(d.id).rank, now[0]))
            for h in plan.hold:
                row = log[h.row.id]
                row.not_before, row.updates = now[0] + h.after_s, row.updates + 1
                updates += 1
            for h in plan.throttle:
                del log[h.row.id]
                throttled += 1
            if plan.spent or len(due) < BATCH:
                break
        if log:
            now[0] = max(now[0] + 1.0, min(r.not_before for r in log.values()))
    times = sorted(t for _, t in released)
    return {
        "rows": rows,
        "released": len(released),
        "throttled": throttled,
        "updates a row": updates / rows,
        "rows out before an older one": sum(1 for a, b in itertools.pairwise(released) if b[0] < a[0]),
        "most overtaken row, s after its place": max((t - times[rank] for rank, t in released), default=0.0),
        "last out, h after due": max(times, default=0.0) / 3600,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=3_000)
    parser.add_argument("--limit", type=int, default=1)
    parser.add_argument("--period-s", type=float, default=60.0)
    parser.add_argument("--api-share", type=float, default=0.0)
    parser.add_argument("--loosen-at-s", type=float, default=None)
    args = parser.parse_args()
    figures = asyncio.run(
        simulate(
            rows=args.rows,
            limit=args.limit,
            period_s=args.period_s,
            api_share=args.api_share,
            loosen_at_s=args.loosen_at_s,
        )
    )
    print(
        f"release queue: {args.rows} rows due at once, rule {args.limit} per {args.period_s:g} s, "
        f"the API taking {args.api_share:.0%}"
        + (f", loosened x10 at {args.loosen_at_s:g} s" if args.loosen_at_s else "")
    )
    for name, value in figures.items():
        print(f"{name:<45} {value:>12,.2f}" if isinstance(value, float) else f"{name:<45} {value:>12,}")


if __name__ == "__main__":
    main()
