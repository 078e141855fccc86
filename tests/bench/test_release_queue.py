"""`bench.release_queue` runs the real pacing over a simulated log: a banked backlog behind a slow
rule costs about two updates a row and goes out in order (before: an update every 5 minutes)."""

from __future__ import annotations

import pytest

from bench.release_queue import simulate


async def test_a_backlog_behind_a_slow_rule_costs_two_updates_a_row_in_order() -> None:
    figures = await simulate(rows=40, limit=1, period_s=60.0, api_share=0.0, loosen_at_s=None)
    assert figures["released"] == 40 and figures["throttled"] == 0
    assert figures["updates a row"] <= 2.0  # parked, then held to its turn (the first goes at once)
    assert figures["rows out before an older one"] == 0
    assert figures["last out, h after due"] * 3600 == pytest.approx(39 * 60.0)  # one a minute from the first


async def test_a_loosened_rule_reaches_the_parked_rows() -> None:
    figures = await simulate(rows=40, limit=1, period_s=60.0, api_share=0.0, loosen_at_s=600.0)
    assert figures["released"] == 40 and figures["rows out before an older one"] == 0
    assert figures["last out, h after due"] * 3600 < 39 * 60.0 / 2  # ten a minute after 10 minutes
