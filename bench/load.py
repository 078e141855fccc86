"""What one benchmark run's load generator measured (the Python client in bench.e2e, or wrk)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Load:
    """What a load generator measured: sends answered, how long it took, and accept latency."""

    sent: int
    elapsed_s: float
    p50_s: float
    p99_s: float
