"""One HTTP/1.1 request as raw bytes over a fresh connection: the hostile tenant's client.

Tenant B in the hostile scenario sends megabyte headers and 600-deep JSON as fast as the API
answers. Through aiohttp a 2 MB ``Authorization`` header cost the *client* 6.3 ms of CPU per
request (its header checks; measured against a server that answers at once), CPU that a real
attacker spends on its own machine but that here came out of the 2 cores the API shares with the
load generators, so it showed up as latency for tenant A. Written as bytes, a request costs a
``memcpy``: what A then sees is what the API spends on B.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    document: Any  # the parsed JSON body, or None when the body is not JSON


async def exchange(
    url: str, *, method: str, path: str, headers: dict[str, str], body: Any, timeout_s: float
) -> Answer:
    """Send one request with ``Connection: close`` and read the answer to the end.

    ``body`` is a JSON value, or None for the body ``{}`` with the caller's content type. Raises
    ``TimeoutError`` when no whole answer came within ``timeout_s`` and ``OSError`` (or
    ``asyncio.IncompleteReadError``) when the server closed the connection without one.
    """
    parts = urlsplit(url)
    payload = json.dumps(body).encode() if body is not None else b"{}"
    all_headers = {"Host": parts.netloc, "Content-Type": "application/json", "Connection": "close"}
    all_headers.update(headers)
    all_headers["Content-Length"] = str(len(payload))
    head = f"{method} {path} HTTP/1.1\r\n".encode() + b"".join(
        f"{k}: {v}\r\n".encode() for k, v in all_headers.items()
    )
    return await asyncio.wait_for(
        _send(parts.hostname or "127.0.0.1", parts.port or 80, head + b"\r\n" + payload), timeout_s
    )


async def _send(host: str, port: int, request: bytes) -> Answer:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request)
        try:
            await writer.drain()
        except ConnectionError:
            pass  # refused mid-request (an oversized head): the answer may already be there
        raw = await reader.read()
    finally:
        writer.close()
    head, separator, content = raw.partition(b"\r\n\r\n")
    if not separator:
        raise ConnectionResetError("the server closed the connection without an answer")
    status = int(head.split(b" ", 2)[1])
    is_json = b"content-type: application/json" in head.lower()
    return Answer(status, json.loads(content) if is_json and content else None)
