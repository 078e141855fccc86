"""What every provider fake shares: request recording, forced-failure knobs, start/stop, a CLI.

A fake is an object with ``async start()`` / ``async stop()`` (or ``async with``), a ``url`` once
started, ``requests`` (every request it received, parsed), and knobs that make the next N
responses fail in a chosen way. Provider-specific permanent errors are per-address maps on each fake.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web


@dataclass
class RecordedRequest:
    """One request as the fake saw it: lower-cased header names, body parsed (JSON or form)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes
    peer: str = ""  # client host:port, i.e. which connection carried it
    at_s: float = field(default_factory=time.time)


@dataclass
class Forced:
    """One forced response: ``kind`` is ``rate_limit``, ``server_error``, ``timeout`` or ``reason``
    (a provider-specific error named by ``reason``)."""

    kind: str
    status: int = 0
    retry_after_s: float | None = None
    delay_s: float = 0.0
    reason: str | None = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class FakeServer:
    """Base of every fake: knobs and records. Subclasses serve the protocol."""

    def __init__(self, *, port: int = 0) -> None:
        self.port = port
        self.requests: list[RecordedRequest] = []
        self._forced: deque[Forced] = deque()
        self.record = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # knobs ---------------------------------------------------------------------------------------
    def force_rate_limit(self, n: int = 1, *, retry_after_s: float = 7.0) -> None:
        """The next ``n`` sends get the provider's 429 with its retry hint."""
        self._forced.extend(Forced("rate_limit", 429, retry_after_s) for _ in range(n))

    def force_server_error(
        self, n: int = 1, *, status: int = 503, retry_after_s: float | None = None
    ) -> None:
        """The next ``n`` sends get a 5xx in the provider's error shape."""
        self._forced.extend(Forced("server_error", status, retry_after_s) for _ in range(n))

    def force_timeout(self, n: int = 1, *, delay_s: float = 5.0) -> None:
        """The next ``n`` sends hang for ``delay_s`` (longer than the client's timeout), then succeed."""
        self._forced.extend(Forced("timeout", delay_s=delay_s) for _ in range(n))

    def next_forced(self) -> Forced | None:
        return self._forced.popleft() if self._forced else None

    def reset(self) -> None:
        self.requests.clear()
        self._forced.clear()

    def sent(self, path_part: str = "") -> list[RecordedRequest]:
        """Recorded requests whose path contains ``path_part``."""
        return [r for r in self.requests if path_part in r.path]

    @property
    def connections_opened(self) -> int:
        """Distinct client connections that carried the recorded requests."""
        return len({r.peer for r in self.requests})

    def info(self) -> dict[str, Any]:
        """What a client in another process needs to talk to this fake (printed by the CLI)."""
        return {"url": self.url}

    # lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


class AiohttpFake(FakeServer):
    """A fake served by aiohttp.web (HTTP/1.1)."""

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    async def start(self) -> None:
        app = web.Application(client_max_size=32 * 1024 * 1024)
        app.add_routes(self.routes())
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        if self.port == 0:
            self.port = int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def capture(self, request: web.Request) -> RecordedRequest:
        raw = await request.read()
        body: Any = None
        if request.content_type == "application/json":
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
        elif request.content_type == "application/x-www-form-urlencoded":
            body = dict((await request.post()).items())
        peer = request.transport.get_extra_info("peername") if request.transport else None
        recorded = RecordedRequest(
            request.method,
            request.path_qs,
            {k.lower(): v for k, v in request.headers.items()},
            body,
            raw,
            peer=f"{peer[0]}:{peer[1]}" if peer else "",
        )
        if self.record:
            self.requests.append(recorded)
        return recorded


def json_response(status: int, document: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status, text=json.dumps(document), content_type="application/json", headers=headers
    )


def run_cli(fake_factory: Any, description: str) -> None:
    """``python -m harness.fakes.<name> --port N``: serve until killed; print ``info()`` as one JSON line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--no-record", action="store_true", help="don't keep requests (long benchmarks)")
    args = parser.parse_args()

    def make() -> Any:
        fake = fake_factory(port=args.port)
        fake.record = not args.no_record
        return fake

    serve_until_killed(make)


def serve_until_killed(make: Any) -> None:
    """Serve the fake ``make()`` builds (inside the event loop) until the process is killed or
    interrupted; print its ``info()`` as one JSON line once it listens, for the parent to read."""

    async def main() -> None:
        async with make() as fake:
            print(json.dumps(fake.info()), flush=True)
            await asyncio.Event().wait()

    run: Any = asyncio.run
    try:
        import uvloop

        # C transports and TLS: under the pure-Python loop the APNs fake, not the client under
        # test, limited bench.providers (47% of its py-spy samples at ~1,400 pushes/s).
        run = uvloop.run
    except ImportError:
        pass
    try:
        run(main())
    except KeyboardInterrupt:
        pass
