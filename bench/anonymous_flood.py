"""Another tenant's accept latency while anonymous clients flood the user-side preference routes.

    .venv/bin/python -m bench.anonymous_flood [--loops 64] [--seconds 8] [--only unsub-replay ...]

Starts its own Tansu broker, a fresh database and `clarion api` as a separate process. Tenant F
has ``--users`` users; tenant A sends an email every 10 ms from two loops (the accept path, with
its outbox and relay). Phases of ``--seconds`` each: A alone, then each flood variant, then A alone
again. A flood is ``--loops`` keep-alive connections in a process of their own, each asking again
as soon as it is answered, with requests prebuilt as bytes (an aiohttp client took a core of the
two here, which is the attacker's machine's cost, not the API's). Variants:

- ``unsub-valid``: ``POST /v1/unsubscribe?token=``, a distinct valid token (user, category) each time;
- ``unsub-replay``: one valid unsubscribe token, over and over (the user already unsubscribed);
- ``unsub-garbage``: well-formed tokens with a wrong signature;
- ``prefs-valid``: ``GET /v1/preferences?token=``, the users' preference tokens in turn;
- ``prefs-replay``: one user's preference token, over and over;
- ``prefs-garbage``: well-formed preference tokens with a wrong signature.

Prints A's accept count, p50, p99 and max per phase, the API process's CPU meanwhile (in cores; the
machine has two, which the flood's own process shares), and how the flood was answered.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import multiprocessing
import secrets
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
import sqlalchemy as sa

from bench.lone_api import lone_api, paced_accepts
from bench.procfs import cpu_s
from clarion.tokens import Purpose, make_token
from harness.tenants import make_tenant

VARIANTS = ("unsub-valid", "unsub-replay", "unsub-garbage", "prefs-valid", "prefs-replay", "prefs-garbage")


@dataclass(frozen=True, slots=True)
class Latency:
    count: int
    refused: int
    p50_ms: float
    p99_ms: float
    max_ms: float

    @staticmethod
    def of(latencies_ms: list[float], refused: int) -> Latency:
        ms = sorted(latencies_ms) or [0.0]
        p99 = statistics.quantiles(ms, n=100, method="inclusive")[98] if len(ms) > 1 else ms[0]
        return Latency(len(ms), refused, statistics.median(ms), p99, ms[-1])


# --- the flood, in a process of its own ------------------------------------------------------------


def _request(method: str, path: str, host: str) -> bytes:
    body = b"List-Unsubscribe=One-Click" if method == "POST" else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: flood\r\n"
    if body:
        head += f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


async def _loop(
    host: str, port: int, requests: list[bytes], start: int, step: int, end_s: float
) -> Counter[str]:
    answers: Counter[str] = Counter()
    i = start
    reader, writer = await asyncio.open_connection(host, port)
    while time.monotonic() < end_s:
        writer.write(requests[i % len(requests)])
        i += step
        status_line = await reader.readline()
        if not status_line:
            writer.close()
            reader, writer = await asyncio.open_connection(host, port)
            answers["connection closed"] += 1
            continue
        length, close = 0, False
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "connection" and "close" in value.lower():
                close = True
        body = await reader.readexactly(length)
        code = body.split(b'"code":"', 1)[1].split(b'"', 1)[0].decode() if b'"code":"' in body else ""
        answers[f"{status_line.split()[1].decode()} {code}".strip()] += 1
        if close:
            writer.close()
            reader, writer = await asyncio.open_connection(host, port)
    writer.close()
    return answers


def _flood(url: str, requests: list[bytes], loops: int, seconds: float, out: multiprocessing.Queue) -> None:
    async def run() -> Counter[str]:
        parts = urlsplit(url)
        end = time.monotonic() + seconds
        done = await asyncio.gather(
            *(_loop(parts.hostname or "", parts.port or 80, requests, n, loops, end) for n in range(loops))
        )
        return sum(done, Counter())

    out.put(dict(asyncio.run(run())))


# --- the tenant that accepts -----------------------------------------------------------------------


async def _accepts(url: str, key: str, seconds: float) -> Latency:
    async with aiohttp.ClientSession() as session:
        return Latency.of(*await paced_accepts(session, url=url, key=key, seconds=seconds, loops=2))


# --- tokens ---------------------------------------------------------------------------------------


def _garbage(purpose: Purpose) -> str:
    """A token of the right shape whose signature is wrong: it costs the API a full check."""
    token = make_token(
        secret=secrets.token_hex(16), tenant_id="t-x", user_id=uuid.uuid4(), purpose=purpose, ttl_s=600,
        category="news" if purpose == "unsubscribe" else None,
    )  # fmt: skip
    return token.split(".")[0] + "." + base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()


def _requests(
    variant: str, *, secret: str, tenant_id: str, users: list[uuid.UUID], host: str, round_: int
) -> list[bytes]:
    def token(user: uuid.UUID, purpose: Purpose, category: str | None = None) -> str:
        return make_token(
            secret=secret, tenant_id=tenant_id, user_id=user, purpose=purpose,
            ttl_s=3600, category=category,
        )  # fmt: skip

    if variant == "unsub-valid":  # a category per round, so each token is a first unsubscribe
        tokens = [token(u, "unsubscribe", f"r{round_}-c{c}") for c in range(8) for u in users]
    elif variant == "unsub-replay":
        tokens = [token(users[0], "unsubscribe", "news")]
    elif variant == "unsub-garbage":
        tokens = [_garbage("unsubscribe") for _ in range(200)]
    elif variant == "prefs-valid":
        tokens = [token(u, "preferences") for u in users]
    elif variant == "prefs-replay":
        tokens = [token(users[0], "preferences")]
    else:
        tokens = [_garbage("preferences") for _ in range(200)]
    method, path = ("POST", "/v1/unsubscribe") if variant.startswith("unsub") else ("GET", "/v1/preferences")
    return [_request(method, f"{path}?token={t}", host) for t in tokens]


# --- the run ---------------------------------------------------------------------------------------


def _print(title: str, latency: Latency, api_cores: float) -> None:
    print(
        f"{title:16s} A accepts {latency.count:5d} (refused {latency.refused})  p50 {latency.p50_ms:6.1f} ms  "
        f"p99 {latency.p99_ms:7.1f} ms  max {latency.max_ms:7.1f} ms  API {api_cores:4.2f} cores",
        flush=True,
    )


async def _measured(api_pid: int, url: str, key: str, seconds: float) -> tuple[Latency, float]:
    """A's accepts for ``seconds``, and the CPU the API process spent meanwhile (cores)."""
    cpu, started = cpu_s(api_pid), time.monotonic()
    latency = await _accepts(url, key, seconds)
    return latency, (cpu_s(api_pid) - cpu) / (time.monotonic() - started)


async def main(*, loops: int, seconds: float, users: int, variants: list[str]) -> None:
    async with lone_api("clarion_bench_anon") as api:
        flooded, accepting = await make_tenant(api.engine), await make_tenant(api.engine)
        async with api.engine.begin() as conn:
            ids = [uuid.uuid4() for _ in range(users)]
            await conn.execute(
                sa.text("INSERT INTO users (id, tenant_id, external_id, email) VALUES (:id, :t, :e, :m)"),
                [
                    {"id": u, "t": flooded.id, "e": f"f-{n}", "m": f"f{n}@example.com"}
                    for n, u in enumerate(ids)
                ],
            )
        await _accepts(api.url, accepting.key, 2)  # warm-up: connections, caches
        _print("alone", *await _measured(api.pid, api.url, accepting.key, seconds))
        context = multiprocessing.get_context("spawn")
        host = f"127.0.0.1:{api.settings.api_port}"
        for round_, variant in enumerate(variants):
            requests = _requests(
                variant, secret=api.settings.secret_key.get_secret_value(), tenant_id=flooded.id, users=ids,
                host=host, round_=round_,
            )  # fmt: skip
            out: multiprocessing.Queue = context.Queue()
            flood = context.Process(target=_flood, args=(api.url, requests, loops, seconds + 1.5, out))
            flood.start()
            await asyncio.sleep(1.0)  # the flood's process started and its loops connected
            flood_started = cpu_s(flood.pid or 0)  # its imports and start-up not counted
            latency, api_cores = await _measured(api.pid, api.url, accepting.key, seconds)
            flood_cores = (cpu_s(flood.pid or 0) - flood_started) / seconds  # still flooding here
            answers = Counter(await asyncio.to_thread(out.get))
            flood.join()
            _print(variant, latency, api_cores)
            rate = sum(answers.values()) / (seconds + 1.5)
            print(
                f"{'':16s} flood {rate:6.0f}/s ({flood_cores:4.2f} cores of its own): "
                + ", ".join(f"{k} x{v}" for k, v in answers.most_common())
            )
        _print("alone again", *await _measured(api.pid, api.url, accepting.key, seconds))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--loops", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--users", type=int, default=500)
    parser.add_argument("--only", nargs="*", choices=VARIANTS, default=list(VARIANTS))
    args = parser.parse_args()
    asyncio.run(main(loops=args.loops, seconds=args.seconds, users=args.users, variants=args.only))
