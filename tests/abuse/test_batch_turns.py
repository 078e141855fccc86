"""A batch's items are validated one event-loop turn each (``api/batch.py``). Until 2026-11-28 the
1,000 items of a batch were validated and hashed in one turn: 4 MB of numbers in their ``data``
(1,000 items of 1,880 each) held every other request 1-2 s, another tenant's accept p99 going
from 22 ms to 1.7 s while two loops sent such batches (342 ms since)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import pytest

from api import batch
from tests.fixtures.sends import email_send


async def test_other_requests_run_between_a_batchs_items(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = 0
    seen: list[int] = []
    validate = batch.NotificationIn.model_validate

    def watched(raw: Any) -> Any:
        seen.append(ticks)  # how far the other task had got when this item's validation began
        return validate(raw)

    async def other_task() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    monkeypatch.setattr(batch.NotificationIn, "model_validate", watched)
    ticker = asyncio.create_task(other_task())
    try:
        items = [email_send() for _ in range(20)]
        response = await client.post("/v1/notifications/batch", json={"notifications": items})
    finally:
        ticker.cancel()
    assert response.status_code == 202, response.text
    assert len(seen) == 20
    assert all(later > earlier for earlier, later in itertools.pairwise(seen)), seen
