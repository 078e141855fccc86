"""Reconciling the notification log with what the providers actually received.

Inputs: the load generator's answers (every ``event_id`` it was told was accepted, with its id), the
log (status per notification, its history of claims), and the providers' side: the sandbox
provider's ``sandbox_messages`` rows and the fakes' ledgers (SendGrid keyed by
``custom_args.notification_id``, Twilio by the ``To`` number, one per notification).

- **lost**: accepted but missing from the log, still not final after the drain deadline, or
  ``sent`` in the log with no provider call behind it.
- **duplicates**: provider calls beyond one per notification. Each is *explained by the lease
  window* when the log shows the notification claimed again after its lease expired (two
  ``sending`` transitions at least ``lease_s`` apart): the worker that first called the provider
  died before recording it.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from chaos.stack import TERMINAL
from schema.shown_status import SHOWN_STATUS_SQL, shown_history


@dataclass
class Reconciliation:
    accepted: int = 0
    in_log: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    missing: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    sent_without_call: list[str] = field(default_factory=list)
    delivered_not_sent: list[str] = field(default_factory=list)
    provider_calls: int = 0
    duplicates: int = 0
    duplicates_explained: int = 0
    duplicates_by_channel: Counter[str] = field(default_factory=Counter)
    reclaimed: int = 0  # claimed again after a lease expired (its worker died or stalled mid-send)
    latencies_s: list[float] = field(default_factory=list)
    # accept -> queued (outbox publish), queued -> claimed (broker + consumer), claimed -> provider,
    # provider -> its outcome recorded (a worker killed in that window has the call made again)
    stages_s: dict[str, list[float]] = field(
        default_factory=lambda: {"publish": [], "consume": [], "send": [], "record": []}
    )
    not_sent: list[dict[str, Any]] = field(default_factory=list)  # examples, for the report

    @property
    def lost(self) -> int:
        return len(self.missing) + len(self.stuck) + len(self.sent_without_call)

    @property
    def sent(self) -> int:
        return self.statuses.get("sent", 0)

    @property
    def duplicate_rate(self) -> float:
        return self.duplicates / self.sent if self.sent else 0.0

    def latency(self, q: float) -> float | None:
        return _quantile(self.latencies_s, q)

    def figures(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "in_log": self.in_log,
            "statuses": dict(self.statuses),
            "lost": self.lost,
            "missing": len(self.missing),
            "stuck": len(self.stuck),
            "sent_without_provider_call": len(self.sent_without_call),
            "provider_calls": self.provider_calls,
            "delivered_but_not_sent_in_log": len(self.delivered_not_sent),
            "duplicates": self.duplicates,
            "duplicates_explained_by_lease_window": self.duplicates_explained,
            "duplicates_by_channel": dict(self.duplicates_by_channel),
            "duplicate_rate": round(self.duplicate_rate, 6),
            "reclaimed_after_lease_expiry": self.reclaimed,
            "latency_p50_s": _round(self.latency(0.5)),
            "latency_p99_s": _round(self.latency(0.99)),
            "latency_max_s": _round(self.latency(1.0)),
            "stages_p50_p99_s": {
                name: [_round(_quantile(values, 0.5)), _round(_quantile(values, 0.99))]
                for name, values in self.stages_s.items()
            },
            "examples": {
                "missing": self.missing[:5],
                "stuck": self.stuck[:5],
                "sent_without_call": self.sent_without_call[:5],
                "not_sent": self.not_sent[:5],
            },
        }


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _round(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None


def read_accepted(path: Path) -> dict[str, str]:
    """event_id -> notification id, for every send the load generator was told was accepted."""
    accepted: dict[str, str] = {}
    if not path.exists():
        return accepted
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if row.get("id"):
            accepted[row["event_id"]] = row["id"]
    return accepted


LOG = f"""
SELECT n.id::text AS id, n.event_id, n.channel, {SHOWN_STATUS_SQL} AS status, n.created_at, n.history, n.queued_at,
       n.error_code, n.error_message, n.attempts, u.phone
  FROM notifications n JOIN users u ON u.id = n.user_id
 WHERE n.tenant_id = $1
"""
SANDBOX = """
SELECT notification_id::text AS id, count(*) AS calls, min(created_at) AS first_at
  FROM sandbox_messages WHERE tenant_id = $1 GROUP BY notification_id
"""


def _reclaimed(history: list[dict[str, Any]]) -> bool:
    """True when the log shows a claim taken from an expired lease: ``sending`` right after
    ``sending`` (the claim only takes a ``sending`` row once its lease has expired)."""
    statuses = [h.get("status") for h in history]
    return any(a == b == "sending" for a, b in itertools.pairwise(statuses))


async def reconcile(
    *,
    dsn: str,
    tenant_id: str,
    accepted: dict[str, str],
    ledgers: dict[str, dict[str, Any]],
    lease_s: float,
) -> Reconciliation:
    """Compare the log with the providers' side (see the module docstring)."""
    rec = Reconciliation(accepted=len(accepted))
    conn = await asyncpg.connect(dsn)
    try:
        await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
        rows = [
            dict(r) | {"history": shown_history(history=r["history"], queued_at=r["queued_at"])}
            for r in await conn.fetch(LOG, tenant_id)
        ]
        sandbox = await conn.fetch(SANDBOX, tenant_id)
    finally:
        await conn.close()
    log = {r["id"]: r for r in rows}
    rec.in_log = len(log)
    rec.statuses = Counter(r["status"] for r in rows)
    by_event = {r["event_id"]: r for r in rows}
    for event_id, nid in accepted.items():
        row = by_event.get(event_id)
        if row is None or row["id"] != nid:
            rec.missing.append(event_id)
    rec.stuck = [r["id"] for r in rows if r["status"] not in TERMINAL]

    calls: Counter[str] = Counter()
    first_at: dict[str, float] = {}
    for s in sandbox:
        calls[s["id"]] += int(s["calls"])
        first_at[s["id"]] = s["first_at"].timestamp()
    by_phone = {r["phone"]: r["id"] for r in rows if r["phone"]}
    for kind, ledger in ledgers.items():
        for key, n in ledger.get("accepted", {}).items():
            owner = by_phone.get(key) if kind == "twilio" else key
            if owner is None or owner not in log:
                continue  # another tenant's (the warm-up probe) or not ours
            calls[owner] += int(n)
            at = float(ledger["first_accepted_at"][key])
            first_at[owner] = min(first_at.get(owner, at), at)
    rec.provider_calls = sum(calls.values())

    for nid, row in log.items():
        n = calls.get(nid, 0)
        if row["status"] == "sent" and n == 0:
            rec.sent_without_call.append(nid)
        if row["status"] != "sent" and n > 0:
            rec.delivered_not_sent.append(nid)
        after_expiry = _reclaimed(row["history"])
        rec.reclaimed += after_expiry
        if n > 1:
            rec.duplicates += n - 1
            rec.duplicates_by_channel[row["channel"]] += n - 1
            if after_expiry:
                rec.duplicates_explained += n - 1
        if row["status"] != "sent" and len(rec.not_sent) < 20:
            rec.not_sent.append(
                {k: row[k] for k in ("id", "status", "error_code", "error_message", "attempts")}
                | {"history": [h.get("status") for h in row["history"]]}
            )
        if row["status"] == "sent" and nid in first_at:
            rec.latencies_s.append(first_at[nid] - row["created_at"].timestamp())
            _stages(rec, row["created_at"].timestamp(), row["history"], first_at[nid])
    return rec


def _stages(rec: Reconciliation, accepted_s: float, history: list[dict[str, Any]], provider_s: float) -> None:
    """Where a sent notification's latency went, from the times its transitions were recorded."""
    at: dict[str, float] = {}
    for h in history:
        if h.get("status") in ("queued", "sending"):
            at.setdefault(h["status"], datetime.fromisoformat(h["at"]).timestamp())
    claimed = [datetime.fromisoformat(h["at"]).timestamp() for h in history if h.get("status") == "sending"]
    if "queued" in at:
        rec.stages_s["publish"].append(at["queued"] - accepted_s)
    if claimed:
        rec.stages_s["consume"].append(claimed[-1] - at.get("queued", accepted_s))
        rec.stages_s["send"].append(provider_s - claimed[-1])
    recorded = [datetime.fromisoformat(h["at"]).timestamp() for h in history if h.get("status") == "sent"]
    if recorded and provider_s <= recorded[0]:  # a clock skew of the fakes' would make it negative
        # The call accepted but not yet recorded: a worker killed here has it made again.
        rec.stages_s["record"].append(recorded[0] - provider_s)
