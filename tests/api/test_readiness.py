"""``/readyz`` checks the database at most once per ``READY_TTL_S`` whoever asks (it is anonymous):
the answer of the last check is reused, healthy or not (``api/routes/health.py``)."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from api.routes.health import READY_TTL_S, Readiness
from harness.services import ApiServer


async def test_a_check_is_reused_for_its_ttl_and_then_made_again(engine: AsyncEngine) -> None:
    down = create_async_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")
    try:
        readiness = Readiness()
        assert await readiness.check(engine) is None
        assert await readiness.check(down) is None  # within the TTL: the last answer, no new check
        await asyncio.sleep(READY_TTL_S)
        assert await readiness.check(down) in {"OSError", "ConnectionRefusedError"}
        assert await readiness.check(engine) in {"OSError", "ConnectionRefusedError"}  # reused too
    finally:
        await down.dispose()


async def test_many_probes_at_once_all_answer_ready(api: ApiServer) -> None:
    async with httpx.AsyncClient(base_url=api.url) as client:
        answers = await asyncio.gather(*(client.get("/readyz") for _ in range(32)))
    assert {(a.status_code, a.json()["status"]) for a in answers} == {(200, "ready")}
