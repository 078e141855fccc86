"""``clarion status``: the ops dashboard's numbers as a terminal table, read from a running API.

It asks ``GET /v1/ops/queues`` with an admin key (``--api-key`` or ``CLARION_API_KEY``). Exit codes:
0 shown, 1 the API cannot be reached or answered badly, 2 no key or the key was refused.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import httpx

EXIT_OK, EXIT_UNREACHABLE, EXIT_AUTH = 0, 1, 2
STATUS_ORDER = (
    "accepted", "queued", "scheduled", "sending", "retrying", "delayed",
    "sent", "failed", "suppressed", "throttled", "duplicate", "expired", "cancelled", "dead",
)  # fmt: skip


class StatusError(Exception):
    """Why the numbers could not be shown; ``exit_code`` is what the command exits with."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def fetch_queues(*, url: str, api_key: str | None, timeout_s: float = 10.0) -> dict[str, Any]:
    """The ``/v1/ops/queues`` report; ``StatusError`` when there is no key, it is refused, or the
    API cannot be reached."""
    if not api_key:
        raise StatusError(
            "set CLARION_API_KEY or pass --api-key (an API key with the admin scope)", EXIT_AUTH
        )
    endpoint = url.rstrip("/") + "/v1/ops/queues"
    try:
        response = httpx.get(endpoint, headers={"Authorization": f"Bearer {api_key}"}, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise StatusError(f"cannot reach the Clarion API at {url}: {exc}", EXIT_UNREACHABLE) from None
    if response.status_code in (401, 403):
        raise StatusError(f"the API refused the key: {_error_text(response)}", EXIT_AUTH)
    if response.status_code != 200:
        raise StatusError(
            f"the API answered {response.status_code}: {_error_text(response)}", EXIT_UNREACHABLE
        )
    try:
        return dict(response.json())
    except ValueError:
        raise StatusError(
            f"{endpoint} did not answer JSON; is {url} a Clarion API?", EXIT_UNREACHABLE
        ) from None


def _error_text(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        return f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return response.text[:200] or response.reason_phrase


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [[str(c) for c in headers], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in cells]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:]]


def render(report: dict[str, Any]) -> str:
    """The report as plain-text tables: lanes (waiting, lag, age, throughput), then statuses."""
    lines: list[str] = []
    kafka = report["kafka"]
    if kafka["available"]:
        lines.append("Kafka: reachable")
    elif "operator token" in str(kafka.get("error")):  # a tenant's key: its own figures, no lag
        lines.append("Kafka: lag is the operator's view (this tenant's notifications only)")
    else:
        lines.append(f"Kafka: UNREACHABLE ({kafka.get('error')})")
    if (log := report.get("log")) is not None:
        lines.append(_log_line(log))
    lane_rows: list[list[object]] = []
    for channel in report["channels"]:
        for lane in channel["lanes"]:
            lane_rows.append(
                [
                    channel["channel"],
                    lane["lane"],
                    lane["depth"],
                    "?" if lane["lag"] is None else lane["lag"],
                    _age(lane["oldest_age_s"]),
                    lane["accepted_last_min"],
                    lane["completed_last_min"],
                    " ".join(f"p{p['partition']}:{p['lag']}" for p in lane["partitions"]) or "-",
                ]
            )
    lines += ["", "QUEUES"]
    lines += _table(
        ["CHANNEL", "LANE", "WAITING", "LAG", "OLDEST", "IN/MIN", "DONE/MIN", "LAG BY PARTITION"], lane_rows
    )
    seen = {s for c in report["channels"] for s in c["counts"]}
    statuses = [s for s in STATUS_ORDER if s in seen] + sorted(seen - set(STATUS_ORDER))
    status_rows = [
        [c["channel"], *(c["counts"].get(s, 0) for s in statuses), c["dlq"], _breakers(c["breakers"])]
        for c in report["channels"]
    ]
    window_min = int(report.get("window_s", 3600)) // 60
    lines += ["", f"STATUS (created in the last {window_min} min)"]
    lines += _table(["CHANNEL", *(s.upper() for s in statuses), "DLQ", "BREAKERS"], status_rows)
    return "\n".join(lines) + "\n"


def _log_line(log: dict[str, Any]) -> str:
    size = f"{log['total_bytes'] / 2**20:,.1f} MiB, " if log.get("total_bytes") is not None else ""
    line = (
        f"Log: {size}{log['days_kept']} day(s) kept since {log['oldest_day'] or '-'} "
        f"(retention {log['retention_days']} days), partitions {log['partitions_ahead']} day(s) ahead"
    )
    if log.get("default_rows"):
        line += f", {log['default_rows']} row(s) in a DEFAULT partition (a day was missing)"
    return line


def _breakers(states: dict[str, str]) -> str:
    return ", ".join(f"{p}={s}" for p, s in sorted(states.items())) or "-"


def main(*, url: str, api_key: str | None, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Print the tables; returns the exit code (messages for failures go to ``err``)."""
    try:
        report = fetch_queues(url=url, api_key=api_key or os.environ.get("CLARION_API_KEY"))
    except StatusError as exc:
        print(f"clarion status: {exc}", file=err)
        return exc.exit_code
    out.write(render(report))
    return EXIT_OK
