"""Health-check latency of `clarion api` while clients send the worst templates we know.

    .venv/bin/python -m bench.hostile_render [--clients 20] [--seconds 20]

Starts its own Tansu broker, a fresh database and `clarion api` as a separate process. For
``--seconds``, a prober asks ``GET /healthz`` every 10 ms, first alone (baseline), then while
``--clients`` clients each send template bombs as inline content in a loop (all refused with a
422). Prints the prober's p50/p99/max for both phases and how the bombs were answered. Target:
/healthz p99 under 50 ms under attack (renders run on the render threads, never on the loop).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter

import aiohttp

from bench.lone_api import lone_api, quantile
from harness.tenants import make_tenant

SHARED = "{% set a=[1] %}" + "{% set a=[a,a] %}" * 24
BOMBS = {
    "power": "{% set a = 2**8000 %}" + "{% set a = a*a %}" * 18 + "{{ a % 10 }}",
    "sum": "{{ ([[0]*100000]*100)|sum(start=[])|length }}",
    "repr": SHARED + "{{ a|string|length }}",
    "concat": SHARED + "{{ 'x' ~ a }}",
    "loop": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "sort": "{{ range(100000)|list|sort|sort|sort|sort|sort|sort|sort|sort|sort|sort|length }}",
    "parens": "{{ " + "(" * 1000 + "1" + ")" * 1000 + " }}",
    "plus": "{{ " + "+".join(["1"] * 3000) + " }}",
}


async def probe(session: aiohttp.ClientSession, url: str, seconds: float) -> list[float]:
    latencies: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        async with session.get(f"{url}/healthz") as r:
            await r.read()
        latencies.append(time.monotonic() - started)
        await asyncio.sleep(0.01)
    return latencies


async def attack(
    session: aiohttp.ClientSession, url: str, key: str, stop: asyncio.Event, n: int, answers: Counter[str]
) -> None:
    names = list(BOMBS)
    i = n
    while not stop.is_set():
        name = names[i % len(names)]
        body = {
            "event_id": f"bomb-{n}-{i}",
            "user": {"id": f"u-{n}", "email": f"u{n}@example.com"},
            "channel": "email",
            "content": {"subject": "s", "body": BOMBS[name]},
        }
        async with session.post(
            f"{url}/v1/notifications", json=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            document = await r.json(content_type=None)
            answers[f"{name} {r.status} {document.get('error', {}).get('code', '')}"] += 1
        i += len(names)


def report(title: str, latencies: list[float]) -> None:
    ms = [v * 1000 for v in latencies]
    print(
        f"{title:34s} {len(ms):5d} probes  p50 {quantile(ms, 0.5):6.1f} ms  "
        f"p99 {quantile(ms, 0.99):6.1f} ms  max {max(ms):7.1f} ms"
    )


async def main(clients: int, seconds: float) -> None:
    async with lone_api("clarion_bench_render") as api:
        tenant = await make_tenant(api.engine)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients + 4)) as session:
            baseline = await probe(session, api.url, seconds)
            stop, answers = asyncio.Event(), Counter[str]()
            attackers = [
                asyncio.create_task(attack(session, api.url, tenant.key, stop, n, answers))
                for n in range(clients)
            ]
            attacked = await probe(session, api.url, seconds)
            stop.set()
            await asyncio.gather(*attackers)
        report("/healthz alone", baseline)
        report(f"/healthz, {clients} clients sending bombs", attacked)
        print(f"bombs answered: {sum(answers.values())}")
        for line, n in sorted(answers.items()):
            print(f"  {line}: {n}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    asyncio.run(main(args.clients, args.seconds))
