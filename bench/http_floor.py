"""The HTTP server's own cost per request: the floor under any API on this stack.

    .venv/bin/python -m bench.http_floor [--seconds 10] [--concurrency 64] [--protocol clarion]

Serves a bare ASGI app (no framework, no database: it reads the body and answers ``202`` with a
fixed JSON body) on the server ``clarion api`` runs (uvicorn with httptools and uvloop; with
``--protocol clarion``, the API's own protocol too: its head and read-deadline guards and its one
write per response, ``api/read_deadline.py``) and drives it with
``bench.e2e``'s wrk load (``bench/send.lua``, the same request). It prints requests/s and the
server process's and wrk's CPU per request. Clarion's API and the reference's spend their CPU above this
floor: ``bench.e2e`` prints theirs per notification, to read side by side (README, "Benchmarks").
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import subprocess
import sys
from typing import Any

import aiohttp

from bench.procfs import cpu_s
from bench.wrk_load import wrk_drive
from clarion.ports import free_port
from harness.services import wait_until

ACCEPTED = b'{"id":"00000000-0000-0000-0000-000000000000","status":"accepted"}'


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Read the request's body whole and answer ``202``; lifespan events are acknowledged."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 202, "headers": headers})
    await send({"type": "http.response.body", "body": ACCEPTED})


async def answers(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as s, s.post(url, data=b"{}") as r:
            return r.status == 202
    except aiohttp.ClientError:
        return False


_CLARION = (
    "import uvicorn; from api.read_deadline import read_deadline_protocol; "
    "uvicorn.run('bench.http_floor:app', port={port}, loop='uvloop', log_level='warning', access_log=False, "
    "http=read_deadline_protocol(head_timeout_s=10, body_timeout_s=30))"
)


def serve(port: int, protocol: str) -> subprocess.Popen[bytes]:
    """``app`` in a uvicorn process of its own (httptools, uvloop), on ``protocol``."""
    if protocol == "clarion":
        return subprocess.Popen([sys.executable, "-c", _CLARION.format(port=port)])
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench.http_floor:app", "--port", str(port), "--loop", "uvloop",
         "--http", "httptools", "--log-level", "warning", "--no-access-log"],
    )  # fmt: skip


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


async def main(seconds: float, concurrency: int, protocol: str) -> None:
    port = free_port()
    server = serve(port, protocol)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_until(lambda: answers(f"{url}/v1/notifications"), 30)
        before, wrk_before = cpu_s(server.pid), _children_cpu_s()
        load = await wrk_drive(url, "unused", seconds, concurrency, "email")
        used, wrk_used = cpu_s(server.pid) - before, _children_cpu_s() - wrk_before
    finally:
        server.terminate()
        server.wait(10)
    print(
        f"bare ASGI app on {protocol}'s protocol (httptools, uvloop), wrk {seconds:g} s, {concurrency} connections"
    )
    print(f"{'requests/s':40} {load.sent / load.elapsed_s:10.0f}")
    print(f"{'latency p50 / p99 (ms)':40} {load.p50_s * 1000:5.1f} / {load.p99_s * 1000:.1f}")
    print(f"{'server CPU ms per request':40} {used * 1000 / load.sent:10.3f}")
    print(f"{'wrk CPU ms per request':40} {wrk_used * 1000 / load.sent:10.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--protocol", choices=["uvicorn", "clarion"], default="uvicorn")
    args = parser.parse_args()
    asyncio.run(main(args.seconds, args.concurrency, args.protocol))
