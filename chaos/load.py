"""The load generator: a separate process that POSTs notifications like a real caller would.

``python -m chaos.load --url U --key K --count N --out F`` sends ``N`` notifications (a channel mix,
one user per notification so every send is traceable at the provider) with ``--concurrency``
requests in flight, paced at ``--rate`` per second when given. Like a well-behaved client it
retries a send that got no answer, a 5xx or a 429 with the *same* ``event_id`` (idempotent), until
``--give-up-s``. ``--batch N`` sends N per ``POST /v1/notifications/batch`` instead (a backlog
loads faster that way). Each notification's final answer is written to ``F`` (JSON lines); a summary of
every answer seen (status codes, error codes, latencies, hangs) is printed as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from typing import Any, TextIO

import aiohttp

CHANNELS = ("email", "sms", "push")


def parse_mix(text: str) -> list[tuple[str, float]]:
    parts = [p.split("=") for p in text.split(",") if p]
    mix = [(name, float(weight)) for name, weight in parts]
    if any(name not in CHANNELS for name, _ in mix):
        raise SystemExit(f"--mix channels are {CHANNELS}")
    return mix


def channel_for(i: int, mix: list[tuple[str, float]]) -> str:
    """Deterministic by index, so every run with the same mix sends the same channels."""
    total = sum(w for _, w in mix)
    x = (i * 0.6180339887) % 1.0 * total
    for name, weight in mix:
        if x < weight:
            return name
        x -= weight
    return mix[-1][0]


def body_for(run: str, i: int, channel: str, priority: str) -> dict[str, Any]:
    user: dict[str, Any] = {"id": f"{run}-u{i}"}
    content: dict[str, Any] = {"body": "Chaos message {{ n }}"}
    if channel == "email":
        user["email"] = f"u{i}@chaos.example.com"
        content["subject"] = "Chaos {{ n }}"
    elif channel == "sms":
        user["phone"] = f"+1{2000000000 + i:010d}"
    else:
        user["devices"] = [{"platform": "apns", "token": f"{i:064x}"}]
        content["title"] = "Chaos {{ n }}"
    return {
        "event_id": f"{run}-{i}",
        "user": user,
        "channel": channel,
        "category": "chaos",
        "priority": priority,
        "content": content,
        "data": {"n": i},
    }


class Stats:
    def __init__(self) -> None:
        self.responses: Counter[str] = Counter()
        self.error_codes: Counter[str] = Counter()
        self.latencies_s: list[float] = []
        self.hangs = 0
        self.connection_errors = 0
        self.final: Counter[str] = Counter()

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies_s)

        def pct(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))], 4) if lat else None

        return {
            "responses": dict(self.responses),
            "error_codes": dict(self.error_codes),
            "connection_errors": self.connection_errors,
            "hangs": self.hangs,
            "final": dict(self.final),
            "latency_p50_s": pct(0.50),
            "latency_p99_s": pct(0.99),
            "latency_max_s": round(lat[-1], 4) if lat else None,
        }


async def send_one(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    stats: Stats,
    *,
    give_up_at: float,
    request_timeout_s: float,
) -> dict[str, Any]:
    tries = 0
    delay_s = 0.2
    while True:
        tries += 1
        started = time.monotonic()
        retry_after_s: float | None = None
        try:
            async with session.post(
                url, json=body, timeout=aiohttp.ClientTimeout(total=request_timeout_s)
            ) as response:
                document = await response.json(content_type=None)
                stats.latencies_s.append(time.monotonic() - started)
                stats.responses[str(response.status)] += 1
                if response.status >= 400 and isinstance(document, dict) and "error" in document:
                    stats.error_codes[f"{response.status}:{document['error'].get('code')}"] += 1
                elif response.status >= 400:
                    stats.error_codes[f"{response.status}:<no error body>"] += 1
                if response.status in (200, 202):
                    return {
                        "event_id": body["event_id"], "channel": body["channel"], "id": document["id"],
                        "code": response.status, "tries": tries, "accepted_at": time.time(),
                    }  # fmt: skip
                if response.status == 429 or response.status >= 500:
                    header = response.headers.get("Retry-After")
                    retry_after_s = float(header) if header and header.isdigit() else None
                else:
                    stats.final[str(response.status)] += 1
                    return {"event_id": body["event_id"], "code": response.status, "tries": tries}
        except TimeoutError:
            stats.hangs += 1
        except (aiohttp.ClientError, OSError):
            stats.connection_errors += 1
        if time.monotonic() >= give_up_at:
            stats.final["gave_up"] += 1
            return {"event_id": body["event_id"], "code": None, "tries": tries}
        await asyncio.sleep(min(retry_after_s or delay_s * random.uniform(0.5, 1.0), 5.0))
        delay_s = min(delay_s * 2, 2.0)


async def send_batch(
    session: aiohttp.ClientSession,
    url: str,
    bodies: list[dict[str, Any]],
    stats: Stats,
    *,
    give_up_at: float,
    request_timeout_s: float,
) -> list[dict[str, Any]]:
    """POST /v1/notifications/batch, retried whole (same event_ids) on no answer or a 5xx/429."""
    tries = 0
    while True:
        tries += 1
        started = time.monotonic()
        try:
            async with session.post(
                f"{url}/batch",
                json={"notifications": bodies},
                timeout=aiohttp.ClientTimeout(total=request_timeout_s),
            ) as response:
                document = await response.json(content_type=None)
                stats.latencies_s.append(time.monotonic() - started)
                stats.responses[str(response.status)] += 1
                if response.status in (200, 202):
                    now = time.time()
                    return [
                        {"event_id": b["event_id"], "channel": b["channel"], "id": r.get("id"),
                         "code": 200 if r.get("duplicate") else 202, "tries": tries, "accepted_at": now}
                        if r.get("error") is None
                        else {"event_id": b["event_id"], "code": 422, "error": r["error"], "tries": tries}
                        for b, r in zip(bodies, document["results"], strict=True)
                    ]  # fmt: skip
                if isinstance(document, dict) and "error" in document:
                    stats.error_codes[f"{response.status}:{document['error'].get('code')}"] += 1
                if 400 <= response.status < 500 and response.status != 429:
                    return [
                        {"event_id": b["event_id"], "code": response.status, "tries": tries} for b in bodies
                    ]
        except TimeoutError:
            stats.hangs += 1
        except (aiohttp.ClientError, OSError):
            stats.connection_errors += 1
        if time.monotonic() >= give_up_at:
            return [{"event_id": b["event_id"], "code": None, "tries": tries} for b in bodies]
        await asyncio.sleep(random.uniform(0.2, 1.0))


async def run(args: argparse.Namespace, out: TextIO) -> dict[str, Any]:
    mix = parse_mix(args.mix)
    stats = Stats()
    slots = asyncio.Semaphore(args.concurrency)
    started = time.monotonic()
    connector = aiohttp.TCPConnector(limit=args.concurrency, force_close=False)
    headers = {"Authorization": f"Bearer {args.key}"}
    url = f"{args.url}/v1/notifications"
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def one(i: int) -> None:
            if args.rate:
                await asyncio.sleep(max(0.0, started + (i - args.start) / args.rate - time.monotonic()))
            async with slots:
                body = body_for(args.run, i, channel_for(i, mix), args.priority)
                result = await send_one(
                    session, url, body, stats,
                    give_up_at=time.monotonic() + args.give_up_s, request_timeout_s=args.request_timeout_s,
                )  # fmt: skip
                if result.get("id"):
                    stats.final[str(result["code"])] += 1
                out.write(json.dumps(result) + "\n")

        async def many(first: int) -> None:
            async with slots:
                indexes = range(first, min(first + args.batch, args.start + args.count))
                bodies = [body_for(args.run, i, channel_for(i, mix), args.priority) for i in indexes]
                results = await send_batch(
                    session, url, bodies, stats,
                    give_up_at=time.monotonic() + args.give_up_s, request_timeout_s=args.request_timeout_s,
                )  # fmt: skip
                for result in results:
                    stats.final[str(result["code"])] += 1
                    out.write(json.dumps(result) + "\n")

        pending: set[asyncio.Task[None]] = set()
        step = args.batch or 1
        for i in range(args.start, args.start + args.count, step):
            while len(pending) >= args.concurrency * 4:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.add(asyncio.create_task(many(i) if args.batch else one(i)))
        if pending:
            await asyncio.wait(pending)
    summary = stats.summary()
    summary["elapsed_s"] = round(time.monotonic() - started, 2)
    summary["count"] = args.count
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description="Drive notifications at a running Clarion API.")
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--start", type=int, default=0, help="first notification index")
    parser.add_argument("--run", default="chaos", help="event_id prefix")
    parser.add_argument("--mix", default="email=1")
    parser.add_argument("--priority", default="normal")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--rate", type=float, default=0.0, help="sends per second (0: as fast as answered)")
    parser.add_argument("--batch", type=int, default=0, help="send N per POST /v1/notifications/batch")
    parser.add_argument("--give-up-s", type=float, default=120.0)
    parser.add_argument("--request-timeout-s", type=float, default=10.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.out, "a", buffering=1) as out:  # one line per answer, flushed as it comes
        summary = asyncio.run(run(args, out))
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
