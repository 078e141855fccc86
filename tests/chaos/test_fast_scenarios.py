"""The fast chaos scenarios at CI scale: real processes, real faults, and nothing may be lost.

Each runs its own private PostgreSQL, Tansu broker and Clarion processes (``chaos.stack``), so it
cannot disturb, or be disturbed by, the rest of the suite. ``make chaos`` runs every scenario at
full scale; these are the same scenarios with a few hundred notifications each.
"""

from __future__ import annotations

from pathlib import Path

from chaos.scenarios import broker, crash, shutdown


async def test_sigkilled_workers_lose_nothing_and_duplicate_only_in_the_lease_window(tmp_path: Path) -> None:
    result = await crash.run(0.03, tmp_path, kill_every_s=3.0, rate=60.0)
    assert result.passed, result.printable()
    assert result.lost == 0 and result.figures["kills"] >= 3


async def test_a_broker_that_comes_back_empty_loses_nothing(tmp_path: Path) -> None:
    result = await broker.run(0.05, tmp_path)
    assert result.passed, result.printable()
    assert result.lost == 0


async def test_sigterm_to_every_process_under_load_loses_nothing(tmp_path: Path) -> None:
    result = await shutdown.run(0.05, tmp_path)
    assert result.passed, result.printable()
    assert result.lost == 0 and result.duplicates == 0
