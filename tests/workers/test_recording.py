"""A batch's outcomes are recorded as they come, not only at its end (``workers.recording``).

The record step is a stand-in that keeps what it was given: the ``record`` transaction itself is
covered by tests/workers/test_record*.py. The pipeline test runs Clarion's own steps from the
claim's rows to the provider (as tests/workers/test_isolation.py does)."""

from __future__ import annotations

import asyncio
from uuid import uuid4

import pytest

from providers.base import RenderedMessage, SendResult
from schema.enums import Status
from tests.workers.test_isolation import Recording as AcceptingProvider
from tests.workers.test_isolation import build, row
from workers import recording as recording_module
from workers.outcome import Outcome
from workers.recipients import Address
from workers.recording import Recording


def outcome() -> Outcome:
    return Outcome(notification_id=uuid4(), status=Status.sent)


class Written:
    """The record step's stand-in: what each call was given; ``hold`` keeps a call open."""

    def __init__(self) -> None:
        self.calls: list[list[Outcome]] = []
        self.called = asyncio.Event()
        self.hold: asyncio.Event | None = None
        self.open = 0
        self.most_open = 0
        self.failures = 0

    async def __call__(self, outcomes: list[Outcome]) -> None:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            if self.failures:
                self.failures -= 1
                raise ConnectionError("database away")
            self.calls.append(list(outcomes))
            self.called.set()
            if self.hold is not None:
                await self.hold.wait()
        finally:
            self.open -= 1


async def test_a_batch_done_sooner_than_the_interval_is_one_record() -> None:
    written = Written()
    first, second = outcome(), outcome()
    async with Recording(record=written, every_s=60) as recording:
        recording.add(first)
        recording.add(second)
    assert written.calls == [[first, second]]
    assert recording.outcomes == [first, second]


async def test_outcomes_are_recorded_while_the_batch_is_still_open() -> None:
    written = Written()
    early, late = outcome(), outcome()
    async with Recording(record=written, every_s=0.01) as recording:
        recording.add(early)
        await asyncio.wait_for(written.called.wait(), 5)
        assert written.calls == [[early]]  # recorded before the block ended
        recording.add(late)
    assert written.calls == [[early], [late]]


async def test_records_never_overlap_and_the_end_waits_for_the_one_in_progress() -> None:
    written = Written()
    written.hold = asyncio.Event()
    early, late = outcome(), outcome()

    async def batch() -> None:
        async with Recording(record=written, every_s=0.01) as recording:
            recording.add(early)
            await asyncio.wait_for(written.called.wait(), 5)
            recording.add(late)

    task = asyncio.create_task(batch())
    await asyncio.wait_for(written.called.wait(), 5)
    for _ in range(20):  # the block has ended; its last record must wait for the held one
        await asyncio.sleep(0)
    assert not task.done()
    assert written.calls == [[early]]
    written.hold.set()
    await asyncio.wait_for(task, 5)
    assert written.calls == [[early], [late]]
    assert written.most_open == 1


async def test_a_block_ended_by_an_exception_still_records_its_outcomes() -> None:
    written = Written()
    reached = outcome()
    with pytest.raises(asyncio.CancelledError):
        async with Recording(record=written, every_s=60) as recording:
            recording.add(reached)
            raise asyncio.CancelledError
    assert written.calls == [[reached]]


async def test_a_cancelled_block_never_waits_for_ever_on_a_record_that_cannot_finish(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker stopping past FastStream's grace has its batch cancelled and its pool closed: the
    last record gives up (the calls are sent again after the lease) instead of holding the stop."""
    monkeypatch.setattr(recording_module, "CANCELLED_WAIT_S", 0.05)
    written = Written()
    written.hold = asyncio.Event()  # never set: the record hangs
    with pytest.raises(asyncio.CancelledError):
        async with Recording(record=written, every_s=60) as recording:
            recording.add(outcome())
            raise asyncio.CancelledError
    assert len(written.calls) == 1 and written.open == 0  # tried, then given up


async def test_a_failed_record_is_retried_with_the_same_outcomes() -> None:
    written = Written()
    written.failures = 1
    reached = outcome()
    async with Recording(record=written, every_s=60) as recording:
        recording.add(reached)
    assert written.calls == [[reached]]


class HoldsOne(AcceptingProvider):
    """Accepts every message at once, except the one to ``slow``: held until ``release``."""

    def __init__(self, slow: str) -> None:
        super().__init__()
        self.slow = slow
        self.release = asyncio.Event()

    async def send(self, message: RenderedMessage) -> SendResult:
        if message.to == self.slow:
            await self.release.wait()
        return await super().send(message)


async def test_the_sends_done_are_recorded_while_one_call_is_still_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a worker killed here would lose: only the call in flight, not the batch's sent ones."""
    rows = [row(f"n-{i}") for i in range(10)]
    addresses = {r.id: [Address(f"+1415555{i:04d}")] for i, r in enumerate(rows)}
    provider = HoldsOne(slow="+14155550009")
    pipeline, _, messages = build(monkeypatch, rows, addresses, provider=provider)
    written = Written()
    async with Recording(record=written, every_s=0.01) as recording:
        batch = asyncio.create_task(pipeline.process(messages, done=recording.add))
        while sum(map(len, written.calls)) < 9:
            await asyncio.wait_for(written.called.wait(), 5)
            written.called.clear()
        recorded = {o.notification_id for call in written.calls for o in call}
        assert recorded == {r.id for r in rows[:9]}
        assert not batch.done()
        provider.release.set()
        await asyncio.wait_for(batch, 5)
    assert [o.notification_id for o in written.calls[-1]] == [rows[9].id]
    assert all(o.status is Status.sent for call in written.calls for o in call)
