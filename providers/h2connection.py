"""One HTTP/2 connection for ``providers.h2client``: ``h2``'s state machine on an ``asyncio.Protocol``.

    H2Error
     ├── H2Timeout        no complete answer within ``timeout_s`` (connect included)
     └── H2ConnectError   could not connect, or the connection or stream was lost before the answer
          └── Unprocessed the server declared the stream unprocessed (GOAWAY, REFUSED_STREAM)

Requests submitted in one loop turn leave in one write; headers go as bytes with h2's outbound
validation off (see ``_CONFIG``); request bodies respect flow control.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

# We build every header ourselves (lower-case names, no connection-specific ones; ``providers.apns``
# checks the tenant-supplied values), so h2's per-request validation and normalisation are pure
# cost: on, bench.providers measured 0.20-0.22 ms of client CPU per push; off, 0.16-0.17 ms.
# Inbound validation stays on: the server's headers are input.
_CONFIG = h2.config.H2Configuration(
    client_side=True,
    header_encoding=None,
    validate_outbound_headers=False,
    normalize_outbound_headers=False,
)


class H2Error(Exception):
    """The request got no HTTP answer."""


class H2Timeout(H2Error):
    """No complete answer within the timeout."""


class H2ConnectError(H2Error):
    """Could not connect, or lost the connection or the stream before the answer."""


class Unprocessed(H2ConnectError):
    """The server says it did not process the stream (GOAWAY below it, REFUSED_STREAM): RFC 9113
    section 8.7 makes it safe to send again, so ``post`` does, once, on another connection."""


@dataclass(frozen=True, slots=True)
class H2Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


@dataclass(slots=True)
class _Stream:
    answer: asyncio.Future[H2Response]
    body: memoryview  # request body not yet sent (flow control)
    status: int = 0
    headers: dict[bytes, bytes] = field(default_factory=dict)
    received: bytearray = field(default_factory=bytearray)


class Http2Connection(asyncio.Protocol):
    """One HTTP/2 connection. ``submit`` queues a request; the bytes leave on the next loop turn."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._h2 = h2.connection.H2Connection(config=_CONFIG)
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, _Stream] = {}
        self._flush_pending = False
        self._capacity = asyncio.Event()
        # Set once the server's first SETTINGS arrived: until then its stream limit is unknown.
        self.settled = asyncio.Event()
        self.usable = True  # false after GOAWAY, loss, or stream ids running out

    # protocol callbacks --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._h2.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.ENABLE_PUSH: 0}
        )
        self._h2.initiate_connection()
        self._capacity.set()
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        self._transport = None
        self._fail_streams(lambda _: True, "connection lost" + (f": {exc!r}" if exc else ""))
        self._capacity.set()  # waiters wake, see the connection is unusable, and go elsewhere
        self.settled.set()

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            self._flush()
            self.close(f"protocol error: {exc!r}")
            return
        for event in events:
            self._on_event(event)
        self._flush()  # acknowledgements, window updates, settings ACK

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            stream = self._streams.get(event.stream_id)
            if stream is not None:
                stream.headers = dict(event.headers or [])  # type: ignore[arg-type]
                stream.status = int(stream.headers.get(b":status", b"0"))
        elif isinstance(event, h2.events.DataReceived):
            self._h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id or 0)
            stream = self._streams.get(event.stream_id or 0)
            if stream is not None:
                stream.received += event.data or b""
        elif isinstance(event, h2.events.StreamEnded):
            stream = self._streams.pop(event.stream_id or 0, None)
            if stream is not None and not stream.answer.done():
                stream.answer.set_result(H2Response(stream.status, stream.headers, bytes(stream.received)))
            self._capacity.set()
        elif isinstance(event, h2.events.StreamReset):
            code = event.error_code
            refused = Unprocessed if code == h2.errors.ErrorCodes.REFUSED_STREAM else H2ConnectError
            self._fail_streams(
                lambda sid: sid == event.stream_id, f"stream reset by server: {code!r}", refused
            )
            self._capacity.set()
        elif isinstance(event, h2.events.WindowUpdated):
            for stream_id, stream in list(self._streams.items()):
                if stream.body:
                    self._send_body(stream_id, stream)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self.settled.set()
            self._capacity.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            # GOAWAY: streams above last_stream_id were not processed; the rest still get answers.
            self.usable = False
            last = event.last_stream_id or 0
            self._fail_streams(
                lambda sid: sid > last, f"server sent GOAWAY ({event.error_code!r})", Unprocessed
            )
            self._capacity.set()
            if not self._streams:
                self.close("GOAWAY")

    # requests ------------------------------------------------------------------------------------
    def has_capacity(self) -> bool:
        # APNs advertises 1000 streams per connection, and may lower that later.
        return self._h2.open_outbound_streams < self._h2.remote_settings.max_concurrent_streams

    async def wait_capacity(self) -> None:
        self._capacity.clear()
        await self._capacity.wait()

    def submit(self, headers: list[tuple[bytes, bytes]], body: bytes) -> tuple[int, _Stream]:
        try:
            stream_id = self._h2.get_next_available_stream_id()
        except h2.exceptions.NoAvailableStreamIDError:
            self.usable = False
            raise
        self._h2.send_headers(stream_id, headers, end_stream=not body)
        stream = _Stream(self._loop.create_future(), memoryview(body))
        self._streams[stream_id] = stream
        if body:
            self._send_body(stream_id, stream)
        if not self._flush_pending:
            # One write (one TLS record, one syscall) per loop turn for every request submitted in
            # it: a write per request measured 0.19-0.22 ms of client CPU per push, this 0.16-0.17.
            self._flush_pending = True
            self._loop.call_soon(self._flush)
        return stream_id, stream

    def _send_body(self, stream_id: int, stream: _Stream) -> None:
        while stream.body:
            size = min(self._h2.local_flow_control_window(stream_id), self._h2.max_outbound_frame_size)
            if size <= 0:
                return  # resumed on WindowUpdated
            chunk, stream.body = stream.body[:size], stream.body[size:]
            self._h2.send_data(stream_id, chunk.tobytes(), end_stream=not stream.body)

    def cancel(self, stream_id: int) -> None:
        """Give up on a stream (timeout): reset it so the server can forget it too."""
        if self._streams.pop(stream_id, None) is None:
            return
        try:
            self._h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        except h2.exceptions.H2Error:
            return
        self._flush()
        self._capacity.set()

    # plumbing ------------------------------------------------------------------------------------
    def _flush(self) -> None:
        self._flush_pending = False
        data = self._h2.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _fail_streams(
        self, which: Callable[[int], bool], reason: str, error: type[H2ConnectError] = H2ConnectError
    ) -> None:
        for stream_id in [sid for sid in self._streams if which(sid)]:
            stream = self._streams.pop(stream_id)
            if not stream.answer.done():
                stream.answer.set_exception(error(reason))

    def close(self, reason: str = "closed") -> None:
        self.usable = False
        if self._transport is not None:
            try:
                self._h2.close_connection()
                self._flush()
            except h2.exceptions.H2Error:
                pass
            self._transport.close()
        self._fail_streams(lambda _: True, reason)
