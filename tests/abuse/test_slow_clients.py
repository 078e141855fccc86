"""A client that sends its request slowly, or not at all, is cut off: a head gets
``CLARION_API_HEAD_TIMEOUT_S`` from its first byte (or from the connection opening) and a 408, a
body ``CLARION_API_BODY_TIMEOUT_S`` from its head. Without them every such connection held one of
the API's file descriptors for ever (``api/read_deadline.py``); an idle keep-alive connection
between requests is left to uvicorn's keep-alive timer, as before."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from clarion.settings import Settings
from harness.services import ApiServer
from tests.conftest import TenantInfo

HEAD_S = 0.5
BODY_S = 0.5


@pytest.fixture
async def strict_api(settings: Settings) -> AsyncIterator[ApiServer]:
    server = ApiServer(
        settings.model_copy(update={"api_head_timeout_s": HEAD_S, "api_body_timeout_s": BODY_S})
    )
    await server.start()
    yield server
    await server.stop()


async def _connect(api: ApiServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", api.settings.api_port)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 answer with a Content-Length body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status_line, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines if line)}
    body = await asyncio.wait_for(reader.readexactly(int(headers["content-length"])), 10)
    return int(status_line.split()[1]), headers, body


async def test_a_connection_that_sends_nothing_gets_a_408_and_is_closed(strict_api: ApiServer) -> None:
    reader, writer = await _connect(strict_api)
    status, _, body = await _answer(reader)
    assert status == 408
    assert json.loads(body)["error"]["code"] == "request_timeout"
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed
    writer.close()


async def test_a_head_trickled_a_byte_at_a_time_is_cut_off_at_its_deadline(strict_api: ApiServer) -> None:
    reader, writer = await _connect(strict_api)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")

    async def trickle() -> int:
        """A byte every 50 ms, well inside any idle timeout, for 10 s (twenty deadlines)."""
        for sent in range(200):
            try:
                writer.write(b"a")
                await writer.drain()
            except ConnectionError:
                return sent
            await asyncio.sleep(0.05)  # the attacker's pace, not a wait for a condition
        return 200

    trickling = asyncio.create_task(trickle())
    status, _, body = await _answer(reader)
    assert status == 408 and json.loads(body)["error"]["code"] == "request_timeout"
    assert not trickling.done() or trickling.result() < 200  # the deadline ended it, not the trickle
    trickling.cancel()
    writer.close()


async def test_a_body_trickled_after_its_head_is_cut_off(strict_api: ApiServer, tenant: TenantInfo) -> None:
    reader, writer = await _connect(strict_api)
    writer.write(
        b"POST /v1/notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + tenant.key.encode() + b'\r\nContent-Length: 1000\r\n\r\n{"event_id"'
    )
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 10) == b""  # closed without an answer
    writer.close()


async def test_a_keep_alive_connection_idle_between_requests_is_kept(strict_api: ApiServer) -> None:
    reader, writer = await _connect(strict_api)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    writer.write(request)
    assert (await _answer(reader))[0] == 200
    await asyncio.sleep(HEAD_S * 2)  # idle past the head deadline, within uvicorn's 5 s keep-alive
    writer.write(request)
    assert (await _answer(reader))[0] == 200
    writer.close()


async def test_a_connection_answered_before_its_body_is_closed_once_idle(strict_api: ApiServer) -> None:
    # A 401 needs no body: the rest of the body arriving after the answer stopped uvicorn's
    # keep-alive timer, and until 2026-11-28 no timer started again (the connection stayed open).
    reader, writer = await _connect(strict_api)
    writer.write(
        b"POST /v1/notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 20\r\n\r\n{"
    )
    await writer.drain()
    assert (await _answer(reader))[0] == 401
    writer.write(b'"event_id": "x"}   ')  # the body's other 19 bytes, after the answer
    await writer.drain()
    rest = await asyncio.wait_for(reader.read(), 10)  # then nothing more is sent
    assert rest == b"" or rest.startswith(b"HTTP/1.1 408"), rest
    writer.close()
