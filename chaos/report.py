"""A scenario's result and the summary table (``chaos/results.md``)."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Result:
    scenario: str
    count: int
    passed: bool = True
    accepted: int = 0
    sent: int = 0
    lost: int = 0
    duplicates: int = 0
    duplicate_rate: float = 0.0
    max_latency_s: float | None = None
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def check(self, ok: bool, failure: str) -> None:
        """Record ``failure`` (and fail the scenario) unless ``ok``."""
        if not ok:
            self.passed = False
            self.failures.append(failure)

    def printable(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


HEADER = (
    "| scenario | notifications | result | accepted | sent | lost | duplicates (rate) | max latency | notes |\n"
    "|---|---:|---|---:|---:|---:|---:|---:|---|\n"
)


def row(r: Result) -> str:
    latency = f"{r.max_latency_s:.2f} s" if r.max_latency_s is not None else "-"
    verdict = "pass" if r.passed else "**FAIL**"
    notes = "; ".join(r.notes + [f"FAILED: {f}" for f in r.failures]).replace("|", "/")
    return (
        f"| {r.scenario} | {r.count:,} | {verdict} | {r.accepted:,} | {r.sent:,} | {r.lost:,} | "
        f"{r.duplicates:,} ({r.duplicate_rate:.3%}) | {latency} | {notes} |\n"
    )


def table(results: list[Result]) -> str:
    return HEADER + "".join(row(r) for r in results)


def write(results: list[Result], path: Path, *, command: str) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    text = (
        "# Chaos results\n\n"
        f"`{command}` on {stamp}, {platform.node() or 'this machine'} "
        "(2 cores, shared with other work while measuring; figures are for this machine only).\n"
        "Latency is accept (row committed) to the provider's first accepted call.\n\n"
        + table(results)
        + "\n<details><summary>figures</summary>\n\n```json\n"
        + json.dumps({r.scenario: r.figures for r in results}, indent=2, default=str)
        + "\n```\n</details>\n"
    )
    path.write_text(text)
    return text
