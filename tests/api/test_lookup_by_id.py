"""A lookup by id names the days to search from the id's UUIDv7 time; any other UUID a caller
sends (another version, a forged time past year 9999) is a plain 404, never a 500."""

from __future__ import annotations

import httpx
import pytest

HOSTILE_IDS = [
    "6d35b049-c12e-4340-8f4a-5cc8f03513ae",  # version 4, no one's (a fixed value: test ids must match across pytest-xdist workers)
    "ffffffff-ffff-7fff-bfff-ffffffffffff",  # version 7, "created" in the year 10889
    "00000000-0000-7000-8000-000000000000",  # version 7, created at the epoch
]


@pytest.mark.parametrize("notification_id", HOSTILE_IDS)
async def test_get_and_cancel_of_a_foreign_or_forged_id_answer_404(
    client: httpx.AsyncClient, notification_id: str
) -> None:
    got = await client.get(f"/v1/notifications/{notification_id}")
    assert got.status_code == 404, got.text
    cancelled = await client.post(f"/v1/notifications/{notification_id}/cancel")
    assert cancelled.status_code == 404, cancelled.text
    assert cancelled.json()["error"]["code"] == "not_found"
