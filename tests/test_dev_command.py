"""`clarion dev` as a newcomer runs it: one command, a database it creates, a broker it starts,
a first send that ends `sent`, and Ctrl-C that stops everything, broker included."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import socket
import sys

import httpx

from clarion.ports import free_port
from commands.runner import first_send_curl
from harness.services import ROOT, drop_database, pg_url, wait_until


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


async def test_clarion_dev_runs_everything_and_stops_cleanly_on_ctrl_c() -> None:
    database_url = pg_url(f"clarion_devcmd_{secrets.token_hex(3)}")  # does not exist yet
    key = f"clk_devtest_{secrets.token_urlsafe(16)}"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    env.update({"CLARION_DATABASE_URL": database_url, "CLARION_DEV_API_KEY": key})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "commands.cli", "dev", "--port", str(port),
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        banner = ""
        assert proc.stdout is not None
        while "Ctrl-C stops everything" not in banner:
            line = (await asyncio.wait_for(proc.stdout.readline(), 90)).decode()
            assert line, f"clarion dev exited early: {proc.returncode}\n{banner}"
            banner += line
        assert f"http://127.0.0.1:{port}/docs" in banner
        assert key in banner
        broker_port = int(re.search(r"broker 127\.0\.0\.1:(\d+)", banner).group(1))  # type: ignore[union-attr]
        # The printed curl is the first send a newcomer makes: run its body as printed.
        curl = first_send_curl(f"http://127.0.0.1:{port}", key)
        body = json.loads(curl.split("-d '", 1)[1].rsplit("'", 1)[0])
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {key}"}, timeout=10
        ) as client:
            accepted = await client.post("/v1/notifications", json=body)
            assert accepted.status_code == 202, accepted.text
            nid = accepted.json()["id"]

            async def sent() -> bool:
                return (await client.get(f"/v1/notifications/{nid}")).json()["status"] == "sent"

            await wait_until(sent, 60)
            messages = (await client.get("/v1/sandbox/messages", params={"notification_id": nid})).json()
            assert messages[0]["recipient"] == "ada@example.com"
            # The banner's metrics URL opens without a token under clarion dev, and counts that send.
            async with httpx.AsyncClient(timeout=10) as anonymous:
                scraped = await anonymous.get(f"http://127.0.0.1:{port}/metrics")
            assert scraped.status_code == 200 and "clarion_notifications_accepted_total" in scraped.text
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
        assert not _listening(port), "the API still listens after Ctrl-C"
        assert not _listening(broker_port), "the Tansu broker outlived clarion dev"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await drop_database(database_url)
