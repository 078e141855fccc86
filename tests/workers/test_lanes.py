"""Main lane first: bulk chunks wait while main-lane work is in flight, never longer than allowed."""

from __future__ import annotations

import asyncio

import pytest

from harness.services import wait_until
from workers.lanes import LanePriority


async def test_bulk_goes_at_once_when_the_main_lane_is_idle() -> None:
    lanes = LanePriority(chunk=10, max_wait_s=60)
    await asyncio.wait_for(lanes.bulk_turn(), 1)
    assert lanes.overridden == 0


async def test_bulk_waits_until_every_main_batch_in_flight_is_done() -> None:
    lanes = LanePriority(chunk=10, max_wait_s=60)
    first, second = asyncio.Event(), asyncio.Event()

    async def main_batch(done: asyncio.Event) -> None:
        async with lanes.urgent():
            await done.wait()

    batches = [asyncio.create_task(main_batch(first)), asyncio.create_task(main_batch(second))]
    await wait_until(lambda: lanes.main_in_flight == 2)
    turn = asyncio.create_task(lanes.bulk_turn())
    await wait_until(lambda: lanes.bulk_waiting == 1)
    assert not turn.done()
    first.set()
    await batches[0]  # its end woke the bulk turn, if it were to wake it, before this returns
    assert lanes.main_in_flight == 1
    assert not turn.done() and lanes.bulk_waiting == 1  # one main batch is still in flight
    second.set()
    await asyncio.wait_for(turn, 1)
    await asyncio.gather(*batches)
    assert lanes.bulk_waiting == 0 and lanes.main_in_flight == 0 and lanes.overridden == 0


async def test_main_lane_failure_still_lets_bulk_go() -> None:
    lanes = LanePriority(chunk=10, max_wait_s=60)
    with pytest.raises(RuntimeError):
        async with lanes.urgent():
            raise RuntimeError("batch failed")
    await asyncio.wait_for(lanes.bulk_turn(), 1)


async def test_bulk_goes_after_max_wait_under_endless_main_traffic() -> None:
    lanes = LanePriority(chunk=10, max_wait_s=0.05)
    async with lanes.urgent():
        await asyncio.wait_for(lanes.bulk_turn(), 1)
    assert lanes.overridden == 1
    assert lanes.waited_s >= 0.05


def test_chunks_keep_order_and_size() -> None:
    lanes = LanePriority(chunk=3, max_wait_s=1)
    assert list(lanes.chunks(list(range(8)))) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert list(lanes.chunks([])) == []
    with pytest.raises(ValueError):
        LanePriority(chunk=0, max_wait_s=1)
