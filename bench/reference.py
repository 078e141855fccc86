"""The reference pipeline Clarion is measured against, run on this machine under the same load.

A straightforward FastAPI + asyncpg + aiokafka + Redis + aiohttp pipeline, as docs/findings.md ("A reference point") describes
it (about 2,000 notifications/s end to end when it was measured there):

- API (FastAPI on uvicorn, uvloop + httptools): checks the bearer key, validates the body with
  pydantic, INSERTs the row (``ON CONFLICT (event_id) DO NOTHING``), awaits the Kafka send, answers
  ``202``: one insert and one awaited publish per request.
- Worker (aiokafka consumer group, manual commits): per fetched batch, one conditional UPDATE claims
  it, one Redis pipeline counts per recipient, each message is rendered (Jinja2) and POSTed to a
  provider stub with aiohttp concurrently, one ``executemany`` records the outcomes; then the
  batch's offsets are committed.
- Provider stub: an aiohttp server answering ``202`` with a message id.

    .venv/bin/python -m bench.reference [--count 10000] [--concurrency 64]

It drives the load with ``bench.e2e``'s client and body shape, so its figures and Clarion's compare
directly; ``python -m bench.e2e --reference`` prints both from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from fastapi import FastAPI, Header, HTTPException
from pydantic import BaseModel, EmailStr

from bench.e2e import Measurement, Pipeline, measure, print_figures, ready
from bench.load import LoadPlan
from clarion.broker import TansuBroker
from clarion.kafka import create_topics
from clarion.pg import asyncpg_dsn
from clarion.ports import free_port
from harness.services import drop_database, pg_url, wait_until
from schema.db import ensure_database

ROOT = Path(__file__).resolve().parents[1]
TOPIC = "reference.email"
SCHEMA = """
CREATE TABLE notifications (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    event_id text NOT NULL UNIQUE,
    user_id text NOT NULL,
    email text NOT NULL,
    template text NOT NULL,
    data jsonb NOT NULL,
    status text NOT NULL DEFAULT 'accepted',
    provider_message_id text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_notifications_status ON notifications (status);
"""


class User(BaseModel):
    id: str
    email: EmailStr
    phone: str | None = None


class SendIn(BaseModel):
    event_id: str
    user: User
    channel: str
    template: str
    data: dict[str, Any] = {}


def api_app(dsn: str, bootstrap: str, key: str) -> FastAPI:
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state["pool"] = await asyncpg.create_pool(dsn, min_size=5, max_size=20)
        state["producer"] = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, acks=1)
        await state["producer"].start()
        yield
        await state["producer"].stop()
        await state["pool"].close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/notifications", status_code=202)
    async def send(body: SendIn, authorization: str = Header()) -> dict[str, str]:
        if authorization != f"Bearer {key}":
            raise HTTPException(401, "bad key")
        row_id = await state["pool"].fetchval(
            "INSERT INTO notifications (event_id, user_id, email, template, data) VALUES ($1, $2, $3, $4, $5)"
            " ON CONFLICT (event_id) DO NOTHING RETURNING id",
            body.event_id, body.user.id, body.user.email, body.template, json.dumps(body.data),
        )  # fmt: skip
        if row_id is None:
            raise HTTPException(409, "duplicate")
        await state["producer"].send_and_wait(TOPIC, str(row_id).encode(), key=body.user.id.encode())
        return {"id": str(row_id), "status": "accepted"}

    @app.get("/readyz")
    async def readyz() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def worker(dsn: str, bootstrap: str, redis_url: str, stub_url: str) -> None:
    import jinja2
    import redis.asyncio as redis

    pool = await asyncpg.create_pool(dsn, min_size=5, max_size=20)
    limiter = redis.from_url(redis_url)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=True)
    welcome = env.from_string("<p>Welcome, {{ name }}!</p><p>Thanks for joining.</p>")
    consumer = AIOKafkaConsumer(
        TOPIC, bootstrap_servers=bootstrap, group_id="reference", enable_auto_commit=False,
        auto_offset_reset="earliest",
    )  # fmt: skip
    await consumer.start()
    async with aiohttp.ClientSession() as http:

        async def send(row: asyncpg.Record) -> tuple[str, str]:
            body = welcome.render(**json.loads(row["data"]))
            payload = {"to": row["email"], "subject": "Welcome", "html": body}
            async with http.post(stub_url, json=payload) as response:
                return row["id"], (await response.json())["id"]

        while True:
            batches = await consumer.getmany(timeout_ms=100, max_records=500)
            for tp, messages in batches.items():
                # One claim, one Redis pipeline and one outcome write per batch: the worker batches,
                # so the API's per-request insert and awaited publish stay the bottleneck.
                rows = await pool.fetch(
                    "UPDATE notifications SET status = 'sending', updated_at = now()"
                    " WHERE id = ANY($1::uuid[]) AND status = 'accepted' RETURNING id, user_id, email, data",
                    [m.value.decode() for m in messages],
                )
                async with limiter.pipeline(transaction=False) as pipe:
                    for row in rows:
                        pipe.incr(f"reference:{row['user_id']}").expire(f"reference:{row['user_id']}", 60)
                    await pipe.execute()
                sent = await asyncio.gather(*(send(row) for row in rows))
                await pool.executemany(
                    "UPDATE notifications SET status = 'sent', provider_message_id = $2, updated_at = now()"
                    " WHERE id = $1",
                    sent,
                )
                await consumer.commit({TopicPartition(tp.topic, tp.partition): messages[-1].offset + 1})


async def stub(port: int) -> None:
    from aiohttp import web

    async def mail(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"id": secrets.token_hex(8)}, status=202)

    app = web.Application()
    app.router.add_post("/mail", mail)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


class Reference:
    """The reference pipeline's processes, database and topic (``run_reference`` drives and measures it)."""

    def __init__(self, bootstrap: str, redis_url: str) -> None:
        self.bootstrap = bootstrap
        self.redis_url = redis_url
        self.url = pg_url(f"clarion_reference_{secrets.token_hex(3)}")
        self.dsn = asyncpg_dsn(self.url)
        self.key = secrets.token_urlsafe(24)
        self.api_port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    async def start(self) -> str:
        await ensure_database(self.url)
        conn = await asyncpg.connect(self.dsn)
        await conn.execute(SCHEMA)
        await conn.close()
        await create_topics(self.bootstrap, partitions=4, names=[TOPIC])
        stub_port = free_port()
        role_args = {
            "api": ["api", self.dsn, self.bootstrap, self.key, str(self.api_port)],
            "stub": ["stub", str(stub_port)],
            "worker": [
                "worker",
                self.dsn,
                self.bootstrap,
                self.redis_url,
                f"http://127.0.0.1:{stub_port}/mail",
            ],
        }
        self.procs = {role: _spawn(args) for role, args in role_args.items()}
        return f"http://127.0.0.1:{self.api_port}"

    async def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        await drop_database(self.url)


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "bench.reference", *args], cwd=ROOT)


def _serve_api(dsn: str, bootstrap: str, key: str, port: int) -> None:
    import uvicorn

    uvicorn.run(
        api_app(dsn, bootstrap, key), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
        log_level="warning", access_log=False,
    )  # fmt: skip


async def run_reference(plan: LoadPlan) -> Measurement:
    """Start the reference pipeline on a broker of its own, drive it, print and return its figures."""
    broker = TansuBroker()
    broker.start()
    reference = Reference(broker.bootstrap, "redis://127.0.0.1:6379/0")
    try:
        url = await reference.start()
        await wait_until(lambda: ready(url), 30)
        processes = {role: proc.pid for role, proc in reference.procs.items()}
        measurement = await measure(Pipeline(url, reference.key, reference.url, processes, broker.pid), plan)
        print_figures(
            f"Reference pipeline (FastAPI + asyncpg + aiokafka + Redis + aiohttp; load: {plan.describe()})",
            measurement,
        )
        return measurement
    finally:
        await reference.stop()
        broker.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("api", "worker", "stub"):
        role, *rest = sys.argv[1:]
        if role == "api":
            _serve_api(rest[0], rest[1], rest[2], int(rest[3]))
        elif role == "worker":
            asyncio.run(worker(*rest))
        else:
            asyncio.run(stub(int(rest[0])))
        raise SystemExit(0)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--count", type=int, default=10_000, help="sends, with --load python")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long wrk sends, with --load wrk")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--load", default="wrk", choices=["wrk", "python"])
    args = parser.parse_args()
    asyncio.run(run_reference(LoadPlan(args.load, args.count, args.seconds, args.concurrency)))
