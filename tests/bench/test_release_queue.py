"""`bench.release_queue` runs the real pacing over a simulated log of one tenant's banked sends."""

from __future__ import annotations

from bench.release_queue import simulate


async def test_a_backlog_larger_than_a_relay_pass_goes_out_in_order() -> None:
    """A row parked at HOLD_AHEAD held no turn, but the pacing queued later holds after it as if it
    did: each time the parked rows came due, the room at the turn they were denied went to the
    next pass's group, one row every 5 minutes (498 rows out of order, one 8.3 h past its place,
    for 3,000 rows behind one a minute)."""
    figures = await simulate(rows=2_100, limit=1, period_s=60.0, api_share=0.0, loosen_at_s=None)
    assert figures["released"] == 2_100 and figures["throttled"] == 0
    assert figures["rows out before an older one"] == 0
    assert figures["last out, h after due"] * 60 == 2_099  # one a minute, none lost to the gaps
