"""The scenarios, by name. Each is ``async run(scale, log_dir) -> Result``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from chaos.report import Result
from chaos.scenarios import backlog, broker, crash, database, hostile, redis, shutdown, storm

Scenario = Callable[[float, Path], Awaitable[Result]]

SCENARIOS: dict[str, Scenario] = {
    "crash": crash.run,
    "broker": broker.run,
    "database": database.run,
    "storm": storm.run,
    "redis": redis.run,
    "backlog": backlog.run,
    "shutdown": shutdown.run,
    "hostile": hostile.run,
}

# Short enough at a small scale to run in CI (tests/chaos).
FAST = ("crash", "broker", "shutdown")
