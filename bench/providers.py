"""Sends per second from one process per provider adapter against its local fake (pool warm).

    .venv/bin/python -m bench.providers [--sends 2000] [--concurrency 100] [--only twilio]
        [--loop uvloop|asyncio] [--apns-connections 2]

Each fake runs in its own subprocess (``python -m harness.fakes.<name>``), so the figure is the
adapter's client-side cost plus the fake's, on the same machine. For the HTTP/1.1 providers an
``httpx`` row posts the identical request with a plain ``httpx.AsyncClient`` (same pool size): the
client the adapters used before they moved to aiohttp. The adapters run on uvloop by default, as in
the workers (``clarion worker`` runs on uvloop); ``--loop asyncio`` measures the standard loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from itertools import cycle
from pathlib import Path
from typing import Any

import httpx

from harness.fakes import make_message
from providers.apns import ApnsProvider
from providers.base import Provider
from providers.fcm import FcmProvider
from providers.sendgrid import SendGridProvider
from providers.settings import ApnsSettings, FcmSettings, SendGridSettings, TwilioSettings
from providers.twilio import TwilioProvider
from schema.enums import Channel

WARMUP_SENDS = 200


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc); 0 without one."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ValueError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_fake(name: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    process = subprocess.Popen(
        [sys.executable, "-m", f"harness.fakes.{name}", "--no-record"], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    return process, json.loads(process.stdout.readline())


def build(name: str, info: dict[str, Any], concurrency: int, apns_connections: int = 2) -> Provider:
    common = {"base_url": info["url"], "max_connections": concurrency, "timeout_s": 30}
    if name == "apns":
        keys = ("key_id", "team_id", "topic", "private_key", "ca_file")
        values = {**{k: info[k] for k in keys}, **common, "connections": apns_connections}
        return ApnsProvider(ApnsSettings.model_validate(values))
    if name == "fcm":
        account = json.dumps(info["service_account"])
        return FcmProvider(FcmSettings.model_validate({"service_account_json": account, **common}))
    if name == "twilio":
        credentials = {"account_sid": info["account_sid"], "auth_token": info["auth_token"]}
        return TwilioProvider(
            TwilioSettings.model_validate({**credentials, "from_number": "+14155550199", **common})
        )
    return SendGridProvider(
        SendGridSettings.model_validate(
            {"api_key": info["api_key"], "from_email": "bench@clarion.test", **common}
        )
    )


CHANNELS = {"apns": Channel.push, "fcm": Channel.push, "twilio": Channel.sms, "sendgrid": Channel.email}


async def httpx_sender(
    name: str, provider: Provider, client: httpx.AsyncClient, info: dict[str, Any]
) -> Callable[[], Awaitable[None]]:
    """One request identical to the adapter's, sent with httpx (the pre-aiohttp baseline); its
    credentials come from the fake's ``info``, as the adapter's did."""
    message = make_message(CHANNELS[name])
    if isinstance(provider, FcmProvider):
        token = await provider.access_token()
        url = provider._url
        auth = {"Authorization": f"Bearer {token}"}
        requests: list[dict[str, Any]] = [  # many devices, as the adapter's run
            {"json": {"message": {"token": f"{i:064x}", "notification": {"title": "t", "body": message.body}}},
             "headers": auth}
            for i in range(1_000)
        ]  # fmt: skip
    elif isinstance(provider, TwilioProvider):
        url = provider._url
        basic = httpx.BasicAuth(info["account_sid"], info["auth_token"])
        requests = [{"data": provider._form(message), "auth": basic}]
    else:
        assert isinstance(provider, SendGridProvider)
        url = provider._url
        requests = [
            {"json": provider.body(message), "headers": {"Authorization": f"Bearer {info['api_key']}"}}
        ]
    each = cycle(requests)

    async def send() -> None:
        response = await client.post(url, **next(each))
        assert response.status_code < 300, response.text

    return send


async def measure(
    send: Callable[[], Awaitable[Any]], sends: int, concurrency: int, fake_pid: int = 0
) -> dict[str, float]:
    """Sends/s, latency, and the CPU per send of this process (the client) and of the fake: when
    the fake's is the larger, the sends/s column measures the fake, not the client."""
    semaphore = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one() -> None:
        async with semaphore:
            started = time.perf_counter()
            await send()
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(one() for _ in range(min(WARMUP_SENDS, sends))))
    latencies.clear()
    cpu_started, fake_started, started = time.process_time(), cpu_s(fake_pid), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(sends)))
    elapsed = time.perf_counter() - started
    cpu_ms = (time.process_time() - cpu_started) * 1000 / sends
    fake_cpu_ms = (cpu_s(fake_pid) - fake_started) * 1000 / sends
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "per_s": sends / elapsed,
        "p50_ms": quantiles[49] * 1000,
        "p99_ms": quantiles[98] * 1000,
        "cpu_ms": cpu_ms,
        "fake_cpu_ms": fake_cpu_ms,
    }


def _to(name: str, i: int) -> dict[str, str]:
    """The ``i``th device of a push provider (one token per device); the default address else."""
    return {"to": f"{i:064x}"} if CHANNELS[name] is Channel.push else {}


async def bench(
    name: str, sends: int, concurrency: int, apns_connections: int
) -> list[tuple[str, dict[str, float]]]:
    process, info = start_fake(name)
    rows = []
    try:
        provider = build(name, info, concurrency, apns_connections)
        # many devices, as real traffic: FCM (and its fake) refuses a device past 240 pushes a minute
        messages = cycle(make_message(CHANNELS[name], **_to(name, i)) for i in range(1_000))
        adapter = f"h2 x{apns_connections}" if name == "apns" else "aiohttp"
        rows.append((f"{name} ({adapter})",
                     await measure(lambda: provider.send(next(messages)), sends, concurrency, process.pid)))  # fmt: skip
        if name != "apns":
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            async with httpx.AsyncClient(limits=limits, timeout=30) as client:
                send = await httpx_sender(name, provider, client, info)
                rows.append(
                    (f"{name} (httpx 1.1, raw)", await measure(send, sends, concurrency, process.pid))
                )
        await provider.aclose()
    finally:
        process.terminate()
        process.wait()
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sends", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--only", choices=sorted(CHANNELS), action="append")
    parser.add_argument("--apns-connections", type=int, default=2, help="HTTP/2 connections to the fake")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    return parser.parse_args()


async def main(args: argparse.Namespace) -> None:
    loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
    print(
        f"{args.sends} sends at concurrency {args.concurrency}, pool warm ({WARMUP_SENDS} sends first),"
        f" {loop} loop\n"
    )
    print(
        f"{'provider (client)':<28}{'sends/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'client CPU ms/send':>20}{'fake CPU ms/send':>18}"
    )
    for name in args.only or ["apns", "fcm", "twilio", "sendgrid"]:
        for label, row in await bench(name, args.sends, args.concurrency, args.apns_connections):
            print(
                f"{label:<28}{row['per_s']:>10.0f}{row['p50_ms']:>10.1f}{row['p99_ms']:>10.1f}{row['cpu_ms']:>20.2f}"
                f"{row['fake_cpu_ms']:>18.2f}"
            )


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.loop == "uvloop":
        import uvloop

        uvloop.run(main(arguments))
    else:
        asyncio.run(main(arguments))
