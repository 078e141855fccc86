"""Provider fakes as separate processes, with a storm knob and a ledger of what they received.

``python -m chaos.fakes sendgrid|twilio --port N [--p5xx 0.3 --p429 0.05 --ptimeout 0.02
--latency-s 0.2]`` serves
the protocol-faithful fake from ``harness.fakes`` and answers a random share of calls with a 5xx, a
429 with ``Retry-After``, or a hang followed by a 504 (the client has given up by then: nothing is
delivered). ``GET /_chaos/ledger`` returns, per delivery key (SendGrid: the
``custom_args.notification_id``; Twilio: the ``To`` number), how many calls were accepted and
refused, the time of the first accepted call, and the number of calls per wall-clock second.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import json
import random
import time
from collections import defaultdict
from typing import Any

from aiohttp import web

from harness.fakes.base import AiohttpFake, Forced, RecordedRequest, json_response, serve_until_killed

_current: contextvars.ContextVar[web.Request | None] = contextvars.ContextVar("request", default=None)


class Ledger:
    """What a fake received, compactly (no bodies kept)."""

    def __init__(self) -> None:
        self.accepted: dict[str, int] = defaultdict(int)
        self.refused: dict[str, int] = defaultdict(int)
        self.first_accepted_at: dict[str, float] = {}
        self.per_second: dict[int, int] = defaultdict(int)
        self.statuses: dict[int, int] = defaultdict(int)
        self.in_flight = 0
        self.max_in_flight = 0

    def document(self) -> dict[str, Any]:
        return {
            "accepted": self.accepted,
            "refused": self.refused,
            "first_accepted_at": self.first_accepted_at,
            "per_second": {str(k): v for k, v in self.per_second.items()},
            "statuses": {str(k): v for k, v in self.statuses.items()},
            "max_in_flight": self.max_in_flight,
        }


def delivery_key(kind: str, recorded: RecordedRequest) -> str:
    body = recorded.body if isinstance(recorded.body, dict) else {}
    if kind == "sendgrid":
        return str(body.get("custom_args", {}).get("notification_id", "?"))
    return str(body.get("To", "?"))


class Storm:
    """Draws a forced failure for a share of calls (independently per call)."""

    def __init__(
        self, *, p5xx: float, p429: float, ptimeout: float, timeout_s: float, retry_after_s: float,
        latency_s: float = 0.0,
    ):  # fmt: skip
        self.p5xx, self.p429, self.ptimeout = p5xx, p429, ptimeout
        self.timeout_s, self.retry_after_s = timeout_s, retry_after_s
        self.latency_s = latency_s  # every call's own time before its answer, as a real API takes

    def draw(self) -> Forced | None:
        r = random.random()
        if r < self.p5xx:
            return Forced("server_error", random.choice((500, 502, 503)))
        if r < self.p5xx + self.p429:
            return Forced("rate_limit", 429, self.retry_after_s)
        if r < self.p5xx + self.p429 + self.ptimeout:
            return Forced("timeout", delay_s=self.timeout_s)
        return None


def build(kind: str, port: int, storm: Storm, api_key: str | None) -> AiohttpFake:
    if kind == "sendgrid":
        from harness.fakes.sendgrid import FakeSendGrid

        base: type[AiohttpFake] = FakeSendGrid
        kwargs: dict[str, Any] = {"api_key": api_key} if api_key else {}
    elif kind == "twilio":
        from harness.fakes.twilio import FakeTwilio

        base, kwargs = FakeTwilio, {}
    else:
        raise SystemExit(f"unknown fake {kind!r}")

    class ChaosFake(base):  # type: ignore[valid-type,misc]
        """The fake, with random failures and a ledger; a forced timeout ends in a 504."""

        def __init__(self) -> None:
            super().__init__(port=port, **kwargs)
            self.record = False
            self.ledger = Ledger()

        def next_forced(self) -> Forced | None:
            forced = storm.draw()
            request = _current.get()
            if forced is not None and forced.kind == "timeout" and request is not None:
                request["chaos_timed_out"] = True  # answered 504 after the hang, never delivered
            return forced

        async def capture(self, request: web.Request) -> RecordedRequest:
            recorded = await super().capture(request)
            request["chaos_recorded"] = recorded
            return recorded

        def routes(self) -> list[web.RouteDef]:
            wrapped = []
            for route in super().routes():
                wrapped.append(web.route(route.method, route.path, self._wrap(route.handler)))
            wrapped.append(web.get("/_chaos/ledger", self._ledger))
            return wrapped

        def _wrap(self, handler: Any) -> Any:
            async def handle(request: web.Request) -> web.StreamResponse:
                ledger = self.ledger
                ledger.per_second[int(time.time())] += 1
                ledger.in_flight += 1
                ledger.max_in_flight = max(ledger.max_in_flight, ledger.in_flight)
                _current.set(request)
                try:
                    if storm.latency_s:
                        await asyncio.sleep(storm.latency_s)
                    response = await handler(request)
                except asyncio.CancelledError:  # the client hung up mid-call: never delivered
                    recorded = request.get("chaos_recorded")
                    ledger.refused[delivery_key(kind, recorded) if recorded is not None else "?"] += 1
                    ledger.statuses[499] += 1
                    raise
                finally:
                    ledger.in_flight -= 1
                recorded = request.get("chaos_recorded")
                key = delivery_key(kind, recorded) if recorded is not None else "?"
                if request.get("chaos_timed_out"):
                    response = json_response(504, {"errors": [{"message": "gateway timeout"}]})
                ledger.statuses[response.status] += 1
                if 200 <= response.status < 300:
                    ledger.accepted[key] += 1
                    ledger.first_accepted_at.setdefault(key, time.time())
                else:
                    ledger.refused[key] += 1
                return response

            return handle

        async def _ledger(self, _: web.Request) -> web.Response:
            return web.Response(text=json.dumps(self.ledger.document()), content_type="application/json")

    return ChaosFake()


def main() -> None:
    parser = argparse.ArgumentParser(description="A provider fake with a storm knob and a ledger.")
    parser.add_argument("kind", choices=["sendgrid", "twilio"])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key")
    parser.add_argument("--p5xx", type=float, default=0.0)
    parser.add_argument("--p429", type=float, default=0.0)
    parser.add_argument("--ptimeout", type=float, default=0.0)
    parser.add_argument("--timeout-s", type=float, default=3.0, help="how long a forced timeout hangs")
    parser.add_argument("--retry-after-s", type=float, default=1.0, help="Retry-After of a forced 429")
    parser.add_argument("--latency-s", type=float, default=0.0, help="every call's time before its answer")
    args = parser.parse_args()
    storm = Storm(
        p5xx=args.p5xx,
        p429=args.p429,
        ptimeout=args.ptimeout,
        timeout_s=args.timeout_s,
        retry_after_s=args.retry_after_s,
        latency_s=args.latency_s,
    )

    serve_until_killed(lambda: build(args.kind, args.port, storm, args.api_key))


if __name__ == "__main__":
    main()
