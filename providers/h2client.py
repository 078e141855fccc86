"""A lean HTTP/2 client: ``h2`` driven from an ``asyncio.Protocol``, over a few pooled connections.

APNs is HTTP/2 only, and ``httpx``'s HTTP/2 (httpcore over anyio streams) cost 1.2-1.9 ms of client
CPU per push: py-spy put two thirds of the client's samples under httpx/httpcore, a socket write
(and a TLS record) per request, and h2's header validation. This client keeps h2 for the protocol
and drops the rest: requests submitted in the same loop iteration leave in one write, and headers
are passed as bytes with h2's per-request validation off (we build them; see ``h2connection._CONFIG``).

Errors: ``providers.h2connection.H2Error`` and its tree (drawn there).

Not a general client: no redirects, cookies, server push or trailers; bodies are bytes.
"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from urllib.parse import urlsplit

import h2.exceptions

from providers.h2connection import (
    H2ConnectError,
    H2Error,
    H2Response,
    H2Timeout,
    Http2Connection,
    Unprocessed,
)

__all__ = ["H2Client", "H2ConnectError", "H2Error", "H2Response", "H2Timeout"]


class H2Client:
    """``connections`` HTTP/2 connections to one origin, opened on first use and replaced when lost.

    Requests go round-robin over the connections; one at its server's stream limit waits for a
    stream to finish. Safe for any number of concurrent ``request`` calls on one event loop.
    """

    def __init__(
        self, origin: str, *, connections: int, timeout_s: float, ca_file: Path | None = None
    ) -> None:
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) origin: {origin!r}")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)
            self._ssl.set_alpn_protocols(["h2"])
        self._prefix = [
            (b":method", b"POST"),
            (b":scheme", parts.scheme.encode()),
            (b":authority", parts.netloc.encode()),
        ]
        self._timeout_s = timeout_s
        self._slots: list[asyncio.Future[Http2Connection] | None] = [None] * connections
        self._next = 0

    async def post(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes) -> H2Response:
        """POST ``body`` to ``path``; the answer, whatever its status. Raises ``H2Error``."""
        request = [*self._prefix, (b":path", path.encode()), *headers]
        try:
            async with asyncio.timeout(self._timeout_s):
                try:
                    return await self._exchange(request, body)
                except Unprocessed:
                    return await self._exchange(request, body)
        except TimeoutError as exc:
            raise H2Timeout(f"no answer within {self._timeout_s} s") from exc
        except h2.exceptions.H2Error as exc:
            raise H2ConnectError(f"HTTP/2 error: {exc!r}") from exc

    async def _exchange(self, request: list[tuple[bytes, bytes]], body: bytes) -> H2Response:
        connection = await self._connection()
        while not (connection.usable and connection.has_capacity()):
            if connection.usable:
                await connection.wait_capacity()
            else:
                connection = await self._connection()
        stream_id, stream = connection.submit(request, body)
        try:
            return await asyncio.shield(stream.answer)
        except asyncio.CancelledError:
            connection.cancel(stream_id)
            raise

    async def _connection(self) -> Http2Connection:
        slot = self._next
        self._next = (slot + 1) % len(self._slots)
        opening = self._slots[slot]
        if opening is not None and opening.done():
            if not opening.cancelled() and opening.exception() is None and opening.result().usable:
                return opening.result()
            opening = None
        if opening is None:
            opening = asyncio.ensure_future(self._open())
            # Retrieved even when every request that waited for it has timed out meanwhile.
            opening.add_done_callback(lambda done: done.cancelled() or done.exception())
            self._slots[slot] = opening
        return await asyncio.shield(opening)

    async def _open(self) -> Http2Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout_s):
                transport, connection = await loop.create_connection(
                    lambda: Http2Connection(loop),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None,
                )
                if (
                    self._ssl is not None
                    and transport.get_extra_info("ssl_object").selected_alpn_protocol() != "h2"
                ):
                    transport.close()
                    raise H2ConnectError(f"{self._host}:{self._port} does not speak HTTP/2 (ALPN)")
                await connection.settled.wait()
        except TimeoutError as exc:
            raise H2ConnectError(
                f"could not connect to {self._host}:{self._port} within {self._timeout_s} s"
            ) from exc
        except (OSError, ssl.SSLError) as exc:
            raise H2ConnectError(f"could not connect to {self._host}:{self._port}: {exc!r}") from exc
        if not connection.usable:
            raise H2ConnectError(f"{self._host}:{self._port} closed the connection before its SETTINGS")
        return connection

    async def aclose(self) -> None:
        """Close every connection; requests in flight fail with ``H2ConnectError``."""
        slots, self._slots = self._slots, [None] * len(self._slots)
        for opening in slots:
            if opening is None:
                continue
            if not opening.done():
                opening.cancel()
            elif not opening.cancelled() and opening.exception() is None:
                opening.result().close()
