"""Bounds on what a chunked request body carries besides its bytes: its chunks, their extensions and
its trailers.

``BodySizeLimit`` (``api/errors.py``) counts the body's bytes as the route reads them, and the head's
limit (``api/head_limit.py``) ends with the head. Nothing counted the rest of a chunked body's
framing, which uvicorn parses on the event loop while the route reads the body and after it has
answered (a 401 answered before the body was read, as every unauthenticated send is):

- every trailer field is a Python call appending to the request's header list, without bound: one
  anonymous connection streaming ``x-t: v`` trailers after a ``0`` chunk grew the API by about
  250 MB a second and held its event loop, another tenant's accept waiting 8.1 s (2026-11-28);
- every chunk is a Python call that copies the body buffered so far (``bytes +=``), quadratic in
  the chunks of one socket read: 1-byte chunks held the loop for the whole attack (5.3 s);
- an extension on each chunk is parsed and dropped: 60 KB extensions on 1-byte chunks made the
  other tenant's accept p50 go from 10 to 324 ms.

Here a request gets at most ``MAX_CHUNKS`` chunks, ``MAX_TRAILER_BYTES`` of trailers (read and
dropped: they never join the request's headers) and
``MAX_FRAMING_BYTES`` of framing (what arrives after its head that is not its body: chunk sizes,
extensions, trailers). Past any of them it is answered ``413 payload_too_large`` in the API's error
shape and the connection closed, or only closed if its answer has started already. A body with a
``Content-Length`` has no framing, and no legitimate client comes near these limits (a 4 MB batch
streamed in 1 KiB chunks is 4,096 chunks with about 40 KB of framing).
"""

from __future__ import annotations

from typing import Any

from api.errors import MAX_HEADER_BYTES
from api.head_limit import MAX_HEADER_COUNT, HeadLimitedProtocol, closing_answer

MAX_CHUNKS = 4096
MAX_TRAILER_BYTES = MAX_HEADER_BYTES
MAX_TRAILER_FIELDS = MAX_HEADER_COUNT
# Framing is measured by the socket read, which may hold the next request's head too (uvloop reads
# up to 256 KiB at a time): the limit leaves room for one such read.
MAX_FRAMING_BYTES = 512 * 1024

_RESPONSE = closing_answer(
    "413 Content Too Large",
    "payload_too_large",
    f"The request body's chunked framing is too large: at most {MAX_CHUNKS} chunks, "
    f"{MAX_TRAILER_BYTES} bytes of trailers and {MAX_FRAMING_BYTES} bytes of chunk "
    "sizes, extensions and trailers in all.",
)


class _FramingTooLarge(Exception):
    """Raised from a parser callback: httptools stops parsing the read there and reports it to
    uvicorn as a parser error, which calls ``send_400_response``."""


class FramingLimitedProtocol(HeadLimitedProtocol):
    """``HeadLimitedProtocol`` that also bounds a request's chunks, trailers and framing bytes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reset_framing()

    def _reset_framing(self) -> None:
        self._chunks = 0
        self._trailer_bytes = 0
        self._trailer_fields = 0
        self._after_head = 0  # bytes of the socket reads that began after this request's head
        self._body_bytes = 0
        self._refused = False

    def data_received(self, data: bytes) -> None:
        if not self._in_head:
            self._after_head += len(data)
            if self._after_head - self._body_bytes > MAX_FRAMING_BYTES:
                self._refuse()
                return
        super().data_received(data)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_chunk_header(self) -> None:
        self._chunks += 1
        if self._chunks > MAX_CHUNKS:
            self._refused = True
            raise _FramingTooLarge

    def on_trailer(self, name: bytes, value: bytes) -> None:
        # A trailer: counted and dropped. uvicorn appended it to the request's headers, which the
        # app reads once it runs, often after the whole body was parsed: a trailer could add a
        # header (an ``Authorization``, a ``traceparent``) that a proxy in front never saw.
        self._trailer_bytes += len(name) + len(value)
        self._trailer_fields += 1  # each a Python call: 4,096 of 4 bytes fit the bytes' bound
        if self._trailer_bytes > MAX_TRAILER_BYTES or self._trailer_fields > MAX_TRAILER_FIELDS:
            self._refused = True
            raise _FramingTooLarge

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reset_framing()

    def send_400_response(self, msg: str) -> None:
        if self._refused:
            self._refuse()
        else:
            super().send_400_response(msg)

    def _refuse(self) -> None:
        if self.transport.is_closing():
            return
        answered = self.cycle is not None and self.cycle.response_started
        self.close_with(b"" if answered else _RESPONSE)
