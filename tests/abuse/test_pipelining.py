"""A connection pipelines at most ``MAX_PIPELINED`` requests behind the one being answered
(``api/pipelining.py``). Until 2026-11-28 uvicorn parsed and queued every request of each read and
served them all, even after the client had gone: 200 anonymous connections wrote 8,000 pipelined
``GET /healthz`` each, 53 MB, and the API answered no one else for 61 s."""

from __future__ import annotations

import asyncio

from api.pipelining import MAX_PIPELINED
from harness.services import ApiServer

_HEALTH = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


async def _answers(api: ApiServer, requests: int) -> tuple[int, bool]:
    """``requests`` pipelined in one write: how many answers came, and whether the API closed."""
    reader, writer = await asyncio.open_connection("127.0.0.1", api.settings.api_port)
    writer.write(_HEALTH * requests)
    await writer.drain()
    answered = 0
    closed = False
    while answered < requests:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        except asyncio.IncompleteReadError:
            closed = True
            break
        assert head.startswith(b"HTTP/1.1 200 "), head
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        await reader.readexactly(length)
        answered += 1
    writer.close()
    return answered, closed


async def test_requests_pipelined_past_the_bound_are_not_read(api: ApiServer) -> None:
    answered, closed = await _answers(api, 2_000)
    assert closed
    assert 1 <= answered <= MAX_PIPELINED + 1, answered  # the one in flight and the queue, in order


async def test_a_few_pipelined_requests_are_all_answered_on_a_kept_connection(api: ApiServer) -> None:
    answered, closed = await _answers(api, MAX_PIPELINED)
    assert answered == MAX_PIPELINED and not closed
