"""A chunked body's framing is bounded: its trailers, its count of chunks and its chunk extensions
(``api/body_framing.py``). Until 2026-11-28 uvicorn parsed all of them on the event loop without a
limit, while the route waited for the body or after it had answered: one anonymous connection
streaming trailers grew the API by about 250 MB a second and held another tenant's accept for the
whole attack. Each test sends a body that never ends: without the bound, no answer comes until the
body's deadline closes the connection silently."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from api.body_framing import MAX_CHUNKS, MAX_FRAMING_BYTES, MAX_TRAILER_BYTES
from clarion.settings import Settings
from harness.services import ApiServer
from tests.conftest import TenantInfo
from tests.fixtures.sends import email_send


@pytest.fixture
async def framed_api(settings: Settings) -> AsyncIterator[ApiServer]:
    # A short body deadline: without the bound, a test fails in seconds rather than 30.
    server = ApiServer(settings.model_copy(update={"api_body_timeout_s": 3.0}))
    await server.start()
    yield server
    await server.stop()


async def _refused_framing(api: ApiServer, key: str, framing: bytes) -> None:
    """``framing`` after a chunked send's head: a 413 ``payload_too_large`` and the connection closed.
    The API closes with the attacker's bytes still unread, so the client's kernel may see a reset
    before the answer; a close past the body's deadline (the bound missing) is a clean end, never
    a reset, with no answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", api.settings.api_port)
    writer.write(
        b"POST /v1/notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + framing
    )
    try:
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)  # until the API closes the connection
    except ConnectionResetError:
        writer.close()
        return
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), answer[:300]
    assert json.loads(body)["error"]["code"] == "payload_too_large"


async def test_trailers_past_the_limit_are_refused(framed_api: ApiServer, tenant: TenantInfo) -> None:
    trailers = b"x-t: " + b"v" * 4_000 + b"\r\n"  # ten of them, past the trailers' bytes
    assert 10 * 4_000 > MAX_TRAILER_BYTES
    await _refused_framing(framed_api, tenant.key, b"1\r\n{\r\n0\r\n" + trailers * 10)


async def test_many_small_trailers_are_refused_past_100_fields(
    framed_api: ApiServer, tenant: TenantInfo
) -> None:
    """Each trailer is a Python call too: 4,096 of 4 bytes fit the trailers' bytes. Refused as the
    framing is, after the route's answer (a 401 here): no second response on the connection (a
    review: counted with the head's fields, a 431 followed the 401)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", framed_api.settings.api_port)
    writer.write(
        b"POST /v1/notifications HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"1\r\n{\r\n0\r\n" + b"x-t: v\r\n" * 4_096 + b"\r\n"
        b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"  # never read: the connection is closed
    )
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    assert answer.count(b"HTTP/1.1 ") == 1, answer[:400]
    assert answer.startswith((b"HTTP/1.1 401 ", b"HTTP/1.1 413 ")), answer[:200]


async def test_chunks_past_the_limit_are_refused(framed_api: ApiServer, tenant: TenantInfo) -> None:
    # Each 1-byte chunk was a Python call copying the body buffered so far: quadratic per socket read.
    await _refused_framing(framed_api, tenant.key, b"1\r\n \r\n" * (MAX_CHUNKS * 2))


async def test_chunk_extensions_past_the_limit_are_refused(framed_api: ApiServer, tenant: TenantInfo) -> None:
    chunk = b"1;" + b"e" * 60_000 + b"\r\n \r\n"
    await _refused_framing(framed_api, tenant.key, chunk * (2 * MAX_FRAMING_BYTES // len(chunk) + 1))


async def test_a_chunked_send_with_a_trailer_is_accepted(framed_api: ApiServer, tenant: TenantInfo) -> None:
    body = json.dumps(email_send()).encode()
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 16]), body[i : i + 16]) for i in range(0, len(body), 16)
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", framed_api.settings.api_port)
    writer.write(
        b"POST /v1/notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + tenant.key.encode() + b"\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n" + chunks + b"0\r\nx-checksum: abc\r\n\r\n"
    )
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    assert answer.startswith(b"HTTP/1.1 202"), answer[:300]
    writer.close()
