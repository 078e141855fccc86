"""A response leaves in one socket write: what a request's cycle writes in one event-loop turn is
joined and written once, at the end of that turn.

uvicorn writes a response's head and its body with a ``transport.write`` each, and uvloop sends
each at once: two ``write`` calls per response, two TCP segments for the client to read. On this
machine's loopback a ``write`` also runs the receiver's side of TCP, and the two per response were
most of the API's system calls (``/proc/<pid>/io``, `bench.e2e`: 2.36 writes per notification).
The view below holds the writes of one turn and writes them together with ``call_soon``, as
``providers/h2client.py`` does for HTTP/2 requests; a body written in a later turn (a streamed
response) goes in that turn's write, and nothing waits longer than the turn it was written in.
What the connection writes or closes itself (a 400, 408 or 431, uvicorn's shutdown and keep-alive
close) flushes the writer first (``HeadLimitedProtocol.flush``), so a response completed in the
same turn is never lost or overtaken. The transport's back-pressure (``pause_writing``) is seen a
turn late: what one turn writes is buffered whole, as uvicorn's cycle already allows.

Measured with ``python -m bench.http_floor --protocol clarion`` (a bare app on this protocol, wrk,
2026-11-28, three runs each, alternating): the server's CPU per request 0.032-0.042 -> 0.026-0.031
ms, wrk's 0.017-0.020 -> 0.012-0.015 ms, requests/s 23,350-31,410 -> 31,625-38,674.
"""

from __future__ import annotations

import asyncio


class TurnWriter:
    """What a request's cycle sees of the connection's transport: ``write``, ``close`` and
    ``is_closing``, the three calls uvicorn's ``RequestResponseCycle`` makes."""

    __slots__ = ("_loop", "_pending", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()
