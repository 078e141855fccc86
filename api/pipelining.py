"""A bound on the requests a connection pipelines: at most ``MAX_PIPELINED`` wait behind the one
being answered.

uvicorn parses every request of a socket read at once, on the event loop, queueing each one past
the first with its scope, cycle and deadline timer; it pauses reading only after the read, and
serves the queue even once the client has gone (the bytes it had sent are still read and parsed).
A request line and a ``Host`` are 35 bytes: 200 anonymous connections wrote 8,000 pipelined
``GET /healthz`` each (53 MB in all, in well under a second) and the API spent the next 61 s
parsing and answering them, another tenant's accepts timing out after 60 s (2026-11-28, a helper's
probe). A client cannot be made to wait for its answers when it does not read them.

Past the bound the rest of the read is dropped and no more is parsed: the requests already queued
are answered in order, then the connection is closed (RFC 9112 9.3.2: a client resends the requests
a closed connection left unanswered). No common client pipelines at all.
"""

from __future__ import annotations

from typing import Any

from api.body_framing import FramingLimitedProtocol

MAX_PIPELINED = 16


class _Overflow(Exception):
    """Raised from the parser's callback: httptools stops parsing the read there."""


class PipelineLimitedProtocol(FramingLimitedProtocol):
    """``FramingLimitedProtocol`` that queues at most ``MAX_PIPELINED`` requests per connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._overflowed = False

    def data_received(self, data: bytes) -> None:
        if self._overflowed:
            return  # the queued answers go out, then the connection closes: nothing more is parsed
        super().data_received(data)

    def on_headers_complete(self) -> None:
        if len(self.pipeline) >= MAX_PIPELINED:
            self._overflowed = True
            self._in_head = False  # no head limit or deadline for a request that will not be read
            raise _Overflow
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if not self._overflowed:
            super().send_400_response(msg)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._overflowed and not self.pipeline and not self.transport.is_closing():
            self.close_with()  # after the last answer queued before the overflow
