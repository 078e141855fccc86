"""The coalescer batches concurrent calls and gives each caller its own answer."""

from __future__ import annotations

import asyncio

import pytest

from clarion.coalesce import Coalescer
from harness.services import wait_until


async def test_concurrent_calls_run_as_one_batch_and_each_gets_its_result() -> None:
    batches: list[list[int]] = []

    async def run(items: list[int]) -> list[int | Exception]:
        batches.append(items)
        return [i * 10 if i != 3 else ValueError("three") for i in items]

    coalescer: Coalescer[int, int] = Coalescer(run, max_batch=100, max_in_flight=1, name="test")
    results = await asyncio.gather(*(coalescer.submit(i) for i in range(6)), return_exceptions=True)
    assert results[:3] == [0, 10, 20] and results[4:] == [40, 50]
    assert isinstance(results[3], ValueError) and str(results[3]) == "three"
    assert batches == [[0, 1, 2, 3, 4, 5]]


async def test_calls_arriving_while_a_batch_runs_wait_for_the_next_one() -> None:
    release = asyncio.Event()
    batches: list[list[str]] = []

    async def run(items: list[str]) -> list[str | Exception]:
        batches.append(items)
        if len(batches) == 1:
            await release.wait()
        return [s.upper() for s in items]

    coalescer: Coalescer[str, str] = Coalescer(run, max_batch=2, max_in_flight=1, name="test")
    first = asyncio.create_task(coalescer.submit("a"))
    await wait_until(lambda: batches == [["a"]])
    later = [asyncio.create_task(coalescer.submit(s)) for s in "bcd"]
    await wait_until(lambda: len(coalescer._waiting) == 3)
    assert batches == [["a"]]  # one slot, busy: b, c, d wait
    release.set()
    assert await first == "A"
    assert [await t for t in later] == ["B", "C", "D"]
    assert batches == [["a"], ["b", "c"], ["d"]]  # at most max_batch at a time


async def test_a_failing_batch_fails_every_caller_in_it() -> None:
    async def run(items: list[int]) -> list[int | Exception]:
        raise ConnectionError("database away")

    coalescer: Coalescer[int, int] = Coalescer(run, max_batch=10, max_in_flight=2, name="test")
    results = await asyncio.gather(*(coalescer.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    with pytest.raises(ConnectionError):  # and the coalescer still takes new calls
        await coalescer.submit(9)
