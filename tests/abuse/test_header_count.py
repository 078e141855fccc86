"""A request has at most ``MAX_HEADER_COUNT`` headers (``api/head_limit.py``). Until 2026-11-28 only
their 16 KiB were bounded: 3,900 empty headers fit, each a Python call in the parser and an entry
the middlewares copy, 2.5 ms of the event loop per request; four anonymous keep-alive loops of
them took another tenant's accept p50 from 7 to 80 ms."""

from __future__ import annotations

import asyncio
import json

from api.head_limit import MAX_HEADER_COUNT
from harness.services import ApiServer


async def _ask(api: ApiServer, headers: int) -> tuple[bytes, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", api.settings.api_port)
    # Host is one of them.
    writer.write(
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"a:\r\n" * (headers - 1) + b"Connection: close\r\n\r\n"
    )
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


async def test_a_request_past_the_header_count_is_a_431(api: ApiServer) -> None:
    head, body = await _ask(api, 3_900)
    assert head.startswith(b"HTTP/1.1 431 "), head
    assert json.loads(body)["error"]["code"] == "headers_too_large"


async def test_a_request_at_the_header_count_is_answered(api: ApiServer) -> None:
    head, _ = await _ask(api, MAX_HEADER_COUNT - 1)  # and Connection
    assert head.startswith(b"HTTP/1.1 200 "), head
