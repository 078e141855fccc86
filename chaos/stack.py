"""A whole Clarion deployment as separate OS processes, private to one scenario.

``Stack.start()`` brings up, in order: a private PostgreSQL (migrated with ``clarion db upgrade``),
an optional private Redis, a Tansu broker (topics made with ``clarion topics create``), the provider
fakes, ``clarion api``, ``clarion worker <channel>`` replicas and ``clarion relay``; then sends one
probe per channel through a tenant of its own and waits for it to be ``sent``, so load starts
against a warm, fully joined deployment. ``Stack.close()`` stops everything, even after a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from chaos.procs import Broker, PrivatePostgres, PrivateRedis, Proc, Supervisor
from clarion.ports import free_port, wait_listening

TERMINAL = ("sent", "failed", "suppressed", "throttled", "duplicate", "cancelled", "expired", "dead")


@dataclass
class StackOptions:
    channels: tuple[str, ...] = ("email", "sms", "push")
    replicas: dict[str, int] = field(default_factory=lambda: {"email": 2})
    lease_s: float = 5.0
    relay_interval_s: float = 0.5
    relay_grace_s: float = 2.0
    relay_stale_queued_s: float = 10.0
    partitions: int = 4
    redis: bool = False
    sendgrid: bool = False  # email through the SendGrid fake (else the sandbox provider)
    twilio: bool = False  # sms through the Twilio fake (else the sandbox provider)
    storm: dict[str, float] = field(default_factory=dict)  # chaos.fakes knobs: p5xx, p429, ptimeout...
    env: dict[str, str] = field(default_factory=dict)  # extra CLARION_* settings for every process


@dataclass
class Fake:
    kind: str
    proc: Proc
    info: dict[str, Any]

    async def ledger(self) -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.get(f"{self.info['url']}/_chaos/ledger") as r:
            return dict(await r.json())


class Stack:
    def __init__(self, options: StackOptions, log_dir: Path) -> None:
        self.options = options
        self.sup = Supervisor(log_dir)
        self.pg = PrivatePostgres(self.sup)
        self.redis = PrivateRedis(self.sup) if options.redis else None
        self.broker = Broker(self.sup)
        self.api_port = free_port()
        self.database = "clarion"
        self.fakes: dict[str, Fake] = {}
        self.workers: dict[str, list[Proc]] = {}
        self.metrics_ports: dict[str, int] = {}
        self.api: Proc | None = None
        self.relay: Proc | None = None
        self.tenant_id = "chaos"
        self.key = ""
        self.timings: dict[str, float] = {}

    # -- addresses -------------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.pg.port}/{self.database}"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a Clarion process of this stack."""
        o = self.options
        env = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
        env.update(
            CLARION_ENV="test",
            CLARION_DATABASE_URL=self.pg.url(self.database),
            CLARION_KAFKA_BOOTSTRAP=self.broker.bootstrap,
            CLARION_TOPIC_PARTITIONS=str(o.partitions),
            CLARION_API_PORT=str(self.api_port),
            CLARION_LEASE_S=str(o.lease_s),
            CLARION_RELAY_INTERVAL_S=str(o.relay_interval_s),
            CLARION_RELAY_GRACE_S=str(o.relay_grace_s),
            CLARION_RELAY_STALE_QUEUED_S=str(o.relay_stale_queued_s),
            CLARION_LOG_LEVEL="WARNING",
        )
        if self.redis is not None:
            env["CLARION_REDIS_URL"] = self.redis.url
        if "sendgrid" in self.fakes:
            info = self.fakes["sendgrid"].info
            env.update(
                CLARION_PROVIDERS__SENDGRID__API_KEY=info["api_key"],
                CLARION_PROVIDERS__SENDGRID__FROM_EMAIL="chaos@clarion.example.com",
                CLARION_PROVIDERS__SENDGRID__BASE_URL=info["url"],
            )
        if "twilio" in self.fakes:
            info = self.fakes["twilio"].info
            env.update(
                CLARION_PROVIDERS__TWILIO__ACCOUNT_SID=info["account_sid"],
                CLARION_PROVIDERS__TWILIO__AUTH_TOKEN=info["auth_token"],
                CLARION_PROVIDERS__TWILIO__FROM_NUMBER="+14155550199",
                CLARION_PROVIDERS__TWILIO__BASE_URL=info["url"],
            )
        env.update(o.env)
        env.update(extra)
        return env

    def clarion(self, name: str, *args: str, **extra_env: str) -> Proc:
        return self.sup.python(name, "commands.cli", *args, env=self.env(**extra_env))

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        started = time.monotonic()
        await asyncio.to_thread(self.pg.init)
        await asyncio.to_thread(self.pg.start)
        if self.redis is not None:
            await asyncio.to_thread(self.redis.start)
        await asyncio.to_thread(self.broker.start)
        for kind, wanted in (("sendgrid", self.options.sendgrid), ("twilio", self.options.twilio)):
            if wanted:
                self.fakes[kind] = await self._start_fake(kind)
        await self._run_to_end(self.clarion("db-upgrade", "db", "upgrade"), 120)
        await self.create_topics()
        self.key = await self.make_tenant(self.tenant_id)
        self.api = self.clarion("api", "api")
        self.api.start()
        await asyncio.to_thread(wait_listening, self.api_port, 60, self.api.popen)
        for channel in self.options.channels:
            self.workers[channel] = []
            for n in range(self.options.replicas.get(channel, 1)):
                name = f"worker-{channel}-{n}"
                port = self.metrics_ports[name] = free_port()
                proc = self.clarion(name, "worker", channel, CLARION_METRICS_PORT=str(port))
                self.workers[channel].append(proc.start())
        port = self.metrics_ports["relay"] = free_port()
        self.relay = self.clarion("relay", "relay", CLARION_METRICS_PORT=str(port)).start()
        self.timings["processes_up_s"] = round(time.monotonic() - started, 1)
        await self.warm_up()
        self.timings["warm_s"] = round(time.monotonic() - started, 1)

    async def close(self) -> None:
        await asyncio.to_thread(self.sup.close)

    async def __aenter__(self) -> Stack:
        """``start``ed; a start that fails part way stops what it had started before it raises."""
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _start_fake(self, kind: str) -> Fake:
        args = [kind, "--port", str(free_port())]
        for knob, value in self.options.storm.items():
            args += [f"--{knob.replace('_', '-')}", str(value)]
        proc = self.sup.python(f"fake-{kind}", "chaos.fakes", *args)
        proc.stdout_pipe = True
        proc.start()
        assert proc.popen is not None and proc.popen.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.popen.stdout.readline), 30)
        return Fake(kind, proc, json.loads(line))

    async def _run_to_end(self, proc: Proc, timeout_s: float) -> None:
        proc.start()
        code = await asyncio.to_thread(proc.wait, timeout_s)
        if code != 0:
            raise RuntimeError(f"{proc.name} exited with {code}; see {proc.log_path}")

    async def create_topics(self) -> None:
        """``clarion topics create``: what an operator runs against a new (or emptied) broker."""
        await self._run_to_end(self.clarion("topics-create", "topics", "create"), 60)

    async def make_tenant(self, tenant_id: str) -> str:
        """A tenant with every scope; returns its API key (via ``clarion keys create``)."""
        proc = self.clarion(f"keys-{tenant_id}", "keys", "create", "--tenant", tenant_id,
                            "--scopes", "send,read,admin,preferences")  # fmt: skip
        proc.stdout_pipe = True
        proc.start()
        assert proc.popen is not None
        out, _ = await asyncio.to_thread(proc.popen.communicate, None, 60)
        if proc.popen.returncode != 0:
            raise RuntimeError(f"clarion keys create failed; see {proc.log_path}")
        return out.decode().strip().splitlines()[-1]

    async def warm_up(self, timeout_s: float = 120.0) -> None:
        """One notification per channel through a separate tenant, until each is ``sent``."""
        from chaos.load import body_for

        key = await self.make_tenant("warmup")
        run = f"warm-{secrets.token_hex(3)}"
        headers = {"Authorization": f"Bearer {key}"}
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession(headers=headers) as session:
            ids = []
            for i, channel in enumerate(self.options.channels):
                body = body_for(run, 900_000_000 + i, channel, "normal")
                async with session.post(f"{self.api_url}/v1/notifications", json=body) as r:
                    if r.status != 202:
                        raise RuntimeError(f"warm-up send refused: {r.status} {await r.text()}")
                    ids.append((await r.json())["id"])
            for nid in ids:
                while True:
                    async with session.get(f"{self.api_url}/v1/notifications/{nid}") as r:
                        if (await r.json()).get("status") == "sent":
                            break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"the stack did not deliver its warm-up send {nid}")
                    await asyncio.sleep(0.3)

    # -- observing -------------------------------------------------------------------------------
    async def call(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        key: str | None = None,
        timeout_s: float = 10.0,
    ) -> tuple[int | None, Any, float]:
        """One API request: (status or None when no answer came, parsed body, seconds it took)."""
        started = time.monotonic()
        headers = {"Authorization": f"Bearer {key or self.key}"}
        try:
            async with (
                aiohttp.ClientSession(headers=headers) as session,
                session.request(
                    method,
                    f"{self.api_url}{path}",
                    json=json_body,
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                ) as r,
            ):
                body = await r.json(content_type=None)
                return r.status, body, time.monotonic() - started
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None, None, time.monotonic() - started

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.dsn)

    async def pending(self, tenant_id: str | None = None) -> int:
        conn = await self.connect()
        try:
            return int(
                await conn.fetchval(
                    "SELECT count(*) FROM notifications WHERE tenant_id = $1 AND status <> ALL($2::text[])",
                    tenant_id or self.tenant_id,
                    list(TERMINAL),
                )
            )
        finally:
            await conn.close()

    async def drain(self, timeout_s: float, tenant_id: str | None = None) -> float:
        """Wait until every notification of the tenant is final; returns the seconds it took."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            try:
                if await self.pending(tenant_id) == 0:
                    break
            except (OSError, asyncpg.PostgresError):
                pass
            await asyncio.sleep(0.5)
        return time.monotonic() - started

    async def scrape(self, name: str, metric: str) -> dict[str, float]:
        """Samples of ``metric`` from a worker's or the relay's /metrics, keyed by their label text
        (empty when the process is down)."""
        port = self.api_port if name == "api" else self.metrics_ports[name]
        samples: dict[str, float] = {}
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r,
            ):
                text = await r.text()
        except (aiohttp.ClientError, OSError, TimeoutError):
            return samples
        for line in text.splitlines():
            if line.startswith(metric):
                name_labels, _, value = line.rpartition(" ")
                samples[name_labels[len(metric) :]] = float(value)
        return samples
