"""The API's HTTP protocol: uvicorn's httptools protocol that refuses an oversized request head
while it is still arriving.

``BodySizeLimit`` (``api/errors.py``) refuses headers over ``MAX_HEADER_BYTES`` once uvicorn has
handed the request to the app, which is after the whole head was received, buffered and parsed on
the API's event loop. For a 2 MB ``Authorization`` header that is 2 MB of socket reads and parsing
per request: in ``python -m chaos hostile --scale 0.2`` with ``CHAOS_HOSTILE_KINDS=huge_bearer``
(tenant B streaming only that request, 4 at a time) tenant A's accept p99 went from 26 ms alone to
278 ms, the one hostile payload that broke the 2x target. Here the connection is answered 431 and
closed as soon as more than the limit has arrived without the head being complete, so such a
request costs one or two socket reads.

The check in ``BodySizeLimit`` stays the exact one: a read that completes the head is let through
here whatever its size (it may carry body bytes too), and the middleware measures the headers.

A request httptools cannot parse (a request line past ~64 KB among them: uvicorn answers those
itself) gets a 400 in the API's error shape rather than uvicorn's plain-text one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.errors import MAX_HEADER_BYTES
from api.turn_writes import TurnWriter

# Room for the request line and the header names next to MAX_HEADER_BYTES (which counts names and
# values): a head that passes the middleware's check never reaches this limit.
HEAD_LIMIT_BYTES = 2 * MAX_HEADER_BYTES
# Each header is a Python call in the parser and an entry the app's middlewares copy and scan: 3,900
# empty ones fit in MAX_HEADER_BYTES, 2.5 ms of the event loop per request, and four anonymous
# keep-alive loops of them took another tenant's accept p50 from 7 to 80 ms (2026-11-28). Apache
# httpd's LimitRequestFields is 100 too.
MAX_HEADER_COUNT = 100


def closing_answer(status: str, code: str, message: str) -> bytes:
    """A whole HTTP response with the API's error body, for a connection the protocol then closes."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    ).encode() + body


_RESPONSE = closing_answer(
    "431 Request Header Fields Too Large",
    "headers_too_large",
    f"The request headers are larger than {MAX_HEADER_BYTES} bytes.",
)
_COUNT_RESPONSE = closing_answer(
    "431 Request Header Fields Too Large",
    "headers_too_large",
    f"The request has more than {MAX_HEADER_COUNT} headers.",
)
_BAD_RESPONSE = closing_answer("400 Bad Request", "bad_request", "The request is not valid HTTP.")


class _TooManyHeaders(Exception):
    """Raised from the parser's header callback past ``MAX_HEADER_COUNT``."""


class HeadLimitedProtocol(HttpToolsProtocol):
    """Counts the bytes of a request head while it is incomplete; past ``HEAD_LIMIT_BYTES`` the
    connection gets a 431 with the error body and is closed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0  # bytes received since the last head was completed
        self._in_head = True
        self._header_count = 0
        self._writer: TurnWriter | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._writer = TurnWriter(transport, self.loop)

    def flush(self) -> None:
        """Write what a response left for the end of this turn (``api/turn_writes.py``) now: every
        write or close of the connection's own goes after it, never before or instead of it."""
        if self._writer is not None:
            self._writer.flush()

    def close_with(self, answer: bytes = b"") -> None:
        """Close the connection after what it already wrote and then ``answer`` (if any)."""
        self.flush()
        if answer:
            self.transport.write(answer)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > HEAD_LIMIT_BYTES and not self.transport.is_closing():
            self.close_with(_RESPONSE)

    def send_400_response(self, msg: str) -> None:
        """A request httptools refused, answered in the API's error shape (uvicorn's is text)."""
        self.close_with(_COUNT_RESPONSE if self._header_count > MAX_HEADER_COUNT else _BAD_RESPONSE)

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called for every header of every request: one frame over uvicorn's, trailers included
        # (`http_floor --protocol clarion`: two levels of override took ~6 us a request).
        if not self._in_head:
            self.on_trailer(name, value)
            return
        self._header_count += 1
        if self._header_count > MAX_HEADER_COUNT:
            raise _TooManyHeaders  # httptools stops parsing there: a 431 through send_400_response
        super().on_header(name, value)

    def on_trailer(self, name: bytes, value: bytes) -> None:
        """A field after a chunked body: uvicorn adds it to the request's headers."""
        super().on_header(name, value)

    def shutdown(self) -> None:
        self.flush()  # a response completed this turn still goes out before the close
        super().shutdown()

    def timeout_keep_alive_handler(self) -> None:
        self.flush()
        super().timeout_keep_alive_handler()

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()
        # The response's head and body in one write (api/turn_writes.py); an upgrade makes no cycle.
        if self._writer is not None and self.cycle is not None:
            self.cycle.transport = self._writer  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._head_bytes = 0
        self._header_count = 0
