"""``clarion api --workers 2`` as a real process: both children serve the port, SIGTERM stops all."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.ports import free_port
from clarion.settings import Settings
from harness.services import ClarionProcess, wait_until
from harness.tenants import TenantInfo, make_tenant
from tests.conftest import METRICS_TOKEN


def children_of(pid: int) -> set[int]:
    """Live processes whose parent is ``pid`` (from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid and stat[0] != "Z":
                found.add(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return stat[0] != "Z"


async def healthy(url: str) -> bool:
    try:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"{url}/healthz")).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture
async def two_workers(
    settings: Settings, engine: AsyncEngine
) -> AsyncIterator[tuple[ClarionProcess, str, set[int], TenantInfo]]:
    own = settings.model_copy(update={"api_port": free_port()})
    proc = ClarionProcess(own, "api", "--workers", "2", extra_env={"CLARION_METRICS_TOKEN": METRICS_TOKEN})
    proc.start()
    url = f"http://127.0.0.1:{own.api_port}"
    try:
        workers: set[int] = await wait_until(
            lambda: len(children_of(proc.pid)) == 2 and children_of(proc.pid), 30
        )
        await wait_until(lambda: healthy(url), 60, 0.2)
        yield proc, url, workers, await make_tenant(engine)
    finally:
        await asyncio.to_thread(proc.stop, 30)


async def test_both_workers_accept_notifications_and_sigterm_stops_every_process(
    two_workers: tuple[ClarionProcess, str, set[int], TenantInfo],
) -> None:
    proc, url, workers, tenant = two_workers
    served: set[int] = set()
    accepted: list[str] = []

    async def both_served() -> bool:
        # A new connection each time: the kernel spreads connections, not requests, over the group.
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {tenant.key}"}) as c:
            response = await c.post(
                "/v1/notifications",
                json={
                    "event_id": f"workers-{len(accepted)}",
                    "user": {"id": "u-workers", "email": "ada@example.com"},
                    "channel": "email",
                    "content": {"subject": "s", "body": "b"},
                },
            )
        assert response.status_code == 202, response.text
        accepted.append(response.json()["id"])
        served.add(int(response.headers["clarion-api-pid"]))
        return served == workers

    await wait_until(both_served, 30, 0)
    assert len(set(accepted)) == len(accepted)

    # Whichever process answers the scrape, it counts what both accepted.
    series = f'clarion_notifications_accepted_total{{channel="email",tenant="{tenant.id}"}}'
    scraped: dict[int, float] = {}

    async def scraped_both() -> bool:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {METRICS_TOKEN}"}) as c:
            response = await c.get(f"{url}/metrics")
        assert response.status_code == 200, response.text
        [line] = [line for line in response.text.splitlines() if line.startswith(series)]
        scraped[int(response.headers["clarion-api-pid"])] = float(line.rsplit(" ", 1)[1])
        return scraped.keys() == workers

    await wait_until(scraped_both, 30, 0)
    assert set(scraped.values()) == {len(accepted)}

    assert await asyncio.to_thread(proc.stop, 30) == 0
    assert not any(alive(pid) for pid in workers)


@pytest.mark.slow
async def test_a_worker_that_dies_takes_the_group_down_for_a_restart(
    two_workers: tuple[ClarionProcess, str, set[int], TenantInfo],
) -> None:
    proc, _, workers, _ = two_workers
    victim, survivor = sorted(workers)

    os.kill(victim, signal.SIGKILL)

    assert proc.proc is not None
    assert await asyncio.to_thread(proc.proc.wait, 30) == 1
    assert not alive(survivor)


@pytest.mark.slow
async def test_workers_refuse_a_port_already_in_use(settings: Settings) -> None:
    single = ClarionProcess(settings.model_copy(update={"api_port": free_port()}), "api")
    single.start()
    try:
        url = f"http://127.0.0.1:{single.env['CLARION_API_PORT']}"
        await wait_until(lambda: healthy(url), 60, 0.2)
        group = ClarionProcess(settings.model_copy(update={"api_port": int(single.env["CLARION_API_PORT"])}),
                               "api", "--workers", "2")  # fmt: skip
        group.start()
        assert group.proc is not None
        assert await asyncio.to_thread(group.proc.wait, 30) == 2
    finally:
        await asyncio.to_thread(single.stop, 30)
