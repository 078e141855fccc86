"""Load from ``wrk`` (C + LuaJIT) instead of a Python client, for ``bench.e2e --load wrk``.

A Python client in the benchmark's own process cost 0.11 ms of CPU per notification (bench.e2e,
2026-11-22), about a sixth of the machine's whole cost per notification on these 2 cores: wrk
leaves that CPU to the pipelines being compared. ``bench/send.lua`` builds each request with a
unique event id. wrk runs for a duration: a thread that stops early (``wrk.thread:stop()``) still
waits for the end of it (wrk 4.1).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
from pathlib import Path

from bench.load import Load

SCRIPT = Path(__file__).with_name("send.lua")


async def wrk_drive(
    url: str,
    key: str,
    seconds: float,
    concurrency: int,
    channel: str,
    *,
    threads: int = 1,
    refusals_ok: bool = False,
) -> Load:
    """Send notifications through ``POST /v1/notifications`` over ``concurrency`` connections for
    ``seconds``; raises ``RuntimeError`` when a connection fails or, unless ``refusals_ok`` (then
    they are counted, not sent), when a send is refused."""
    exe = shutil.which("wrk")
    if exe is None:
        raise SystemExit("wrk is not installed: `make bench` installs it (scripts/wrk.sh)")
    env = {
        **os.environ,
        "BENCH_KEY": key,
        "BENCH_CHANNEL": channel,
        "BENCH_RUN": f"wrk-{secrets.token_hex(4)}",
    }
    args = [f"-t{threads}", f"-c{max(concurrency, threads)}", f"-d{seconds:g}s", "--timeout", "10s"]
    proc = await asyncio.create_subprocess_exec(
        exe, *args, "-s", str(SCRIPT), f"{url}/v1/notifications",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )  # fmt: skip
    out, err = await proc.communicate()
    lines = [line for line in out.decode().splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {err.decode()[-500:]} {out.decode()[-500:]}")
    figures = json.loads(lines[-1])
    if (figures["refused"] and not refusals_ok) or figures["errors"]:
        raise RuntimeError(f"wrk: {figures['refused']} sends refused, {figures['errors']} connection errors")
    return Load(
        sent=figures["requests"] - figures["refused"],
        elapsed_s=figures["duration_us"] / 1e6,
        p50_s=figures["p50_us"] / 1e6,
        p99_s=figures["p99_us"] / 1e6,
        refused=figures["refused"],
    )
