"""A minimal HTTP/2 server (h2 over asyncio, TLS with ALPN ``h2`` or cleartext prior knowledge).

Frames each response as APNs does: a response without a body is one HEADERS frame with
END_STREAM; one with a body is HEADERS, then DATA carrying the body with END_STREAM. (hypercorn
adds a zero-length DATA frame with END_STREAM after every response, which aioapns treats as fatal.)
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import cast

import h2.config
import h2.connection
import h2.events
import h2.exceptions

# (method, path, headers in order, body) -> (status, headers, body)
Handler = Callable[
    [str, str, list[tuple[str, str]], bytes, str], Awaitable[tuple[int, list[tuple[str, str]], bytes]]
]


class _Connection(asyncio.Protocol):
    def __init__(self, handler: Handler, owner: H2Server) -> None:
        self._handler = handler
        self._tasks = owner.tasks
        self._transports = owner.transports
        self._connections = owner.connections
        self._h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self._streams: dict[int, tuple[list[tuple[str, str]], bytearray]] = {}
        self._transport: asyncio.Transport | None = None
        self._peer = ""
        self._flush_pending = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transports.add(self._transport)
        self._connections.add(self)
        peer = transport.get_extra_info("peername") or ("", 0)
        self._peer = f"{peer[0]}:{peer[1]}"
        self._h2.initiate_connection()
        self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        if self._transport is not None:
            self._transports.discard(self._transport)

    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            self._flush()
            if self._transport is not None:
                self._transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                headers = [(_text(k).lower(), _text(v)) for k, v in event.headers or []]
                self._streams[event.stream_id] = (headers, bytearray())
            elif isinstance(event, h2.events.DataReceived) and event.stream_id in self._streams:
                self._streams[event.stream_id][1].extend(event.data or b"")
                self._h2.acknowledge_received_data(event.flow_controlled_length or 0, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded) and event.stream_id in self._streams:
                headers, body = self._streams.pop(event.stream_id)
                task = asyncio.create_task(self._serve(event.stream_id, headers, bytes(body)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif isinstance(event, h2.events.StreamReset):
                self._streams.pop(event.stream_id, None)
        self._flush()

    async def _serve(self, stream_id: int, headers: list[tuple[str, str]], body: bytes) -> None:
        pseudo = {k: v for k, v in headers if k.startswith(":")}
        regular = [(k, v) for k, v in headers if not k.startswith(":")]
        status, response_headers, response_body = await self._handler(
            pseudo.get(":method", ""), pseudo.get(":path", ""), regular, body, self._peer
        )
        try:
            self._h2.send_headers(
                stream_id, [(":status", str(status)), *response_headers], end_stream=not response_body
            )
            if response_body:
                self._h2.send_data(stream_id, response_body, end_stream=True)
        except h2.exceptions.H2Error:
            return  # the client reset the stream or closed the connection meanwhile
        if not self._flush_pending:
            # Every response finished in this loop turn leaves in one write: with 100 pushes in
            # flight the fake, not the client, limited bench.providers (a TLS record per response).
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def goaway(self) -> None:
        """Send GOAWAY (NO_ERROR) naming the last stream received: answer those, take no new ones."""
        self._h2.close_connection(last_stream_id=self._h2.highest_inbound_stream_id)
        self._flush()

    def _flush(self) -> None:
        self._flush_pending = False
        outbound = self._h2.data_to_send()
        if outbound and self._transport is not None and not self._transport.is_closing():
            self._transport.write(outbound)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class H2Server:
    """The listening socket, its connections and in-flight requests."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()
        self.transports: set[asyncio.Transport] = set()
        self.connections: set[_Connection] = set()
        self.server: asyncio.Server | None = None

    async def close(self) -> None:
        """Stop listening, close every connection and cancel every in-flight request."""
        if self.server is not None:
            self.server.close()
        for transport in list(self.transports):
            transport.close()
        for task in list(self.tasks):
            task.cancel()
        if self.server is not None:
            await self.server.wait_closed()


async def serve_h2(handler: Handler, port: int, ssl_context: ssl.SSLContext | None) -> H2Server:
    """Listen on 127.0.0.1:``port`` (0: any free port, see ``server.sockets``)."""
    owner = H2Server()
    owner.server = await asyncio.get_running_loop().create_server(
        lambda: _Connection(handler, owner), "127.0.0.1", port, ssl=ssl_context
    )
    return owner


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile, keyfile)
    context.set_alpn_protocols(["h2"])
    return context
