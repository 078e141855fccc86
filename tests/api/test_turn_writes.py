"""A response's head and body leave the API in one socket write (``api/turn_writes.py``), and nothing
written is lost or held past the turn it was written in: the API's real protocol, served by
uvicorn over a real socket, with the transport's writes counted on their way to the socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.server import ServerState

from api.read_deadline import read_deadline_protocol
from api.turn_writes import TurnWriter


class CountedTransport:
    """The socket's transport, with every ``write`` it receives kept in order."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


async def streamed(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/one``: head and body in one turn; ``/two``: a second body chunk a turn later."""
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"first", "more_body": scope["path"] == "/two"})
    if scope["path"] == "/two":
        await asyncio.sleep(0.05)
        await send({"type": "http.response.body", "body": b"second"})


@pytest.fixture
async def served() -> AsyncIterator[tuple[int, list[CountedTransport]]]:
    config = Config(app=streamed, loop="asyncio", log_level="warning", access_log=False)
    config.load()
    protocol = read_deadline_protocol(head_timeout_s=10, body_timeout_s=30)
    counted: list[CountedTransport] = []
    state = ServerState()

    def build() -> asyncio.Protocol:
        made = protocol(config=config, server_state=state, app_state={})
        original = made.connection_made

        def connection_made(transport: asyncio.BaseTransport) -> None:
            counted.append(CountedTransport(transport))  # type: ignore[arg-type]
            original(counted[-1])  # type: ignore[arg-type]

        made.connection_made = connection_made  # type: ignore[method-assign]
        return made

    server = await asyncio.get_running_loop().create_server(build, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1], counted
    server.close()


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return answer


async def test_a_response_leaves_in_one_write(served: tuple[int, list[CountedTransport]]) -> None:
    port, counted = served
    answer = await _get(port, "/one")
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\n5\r\nfirst\r\n0\r\n\r\n")
    assert len(counted[0].writes) == 1
    assert counted[0].writes[0] == answer


async def test_a_body_written_a_turn_later_still_leaves_in_its_own_turn(
    served: tuple[int, list[CountedTransport]],
) -> None:
    port, counted = served
    answer = await _get(port, "/two")
    assert answer.endswith(b"5\r\nfirst\r\n6\r\nsecond\r\n0\r\n\r\n")
    head_and_first, rest = counted[0].writes
    assert head_and_first.endswith(b"5\r\nfirst\r\n") and rest == b"6\r\nsecond\r\n0\r\n\r\n"


async def test_close_writes_what_the_turn_held_first() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    class Recorder:
        def write(self, data: bytes) -> None:
            seen.append(data.decode())

        def close(self) -> None:
            seen.append("close")

        def is_closing(self) -> bool:
            return "close" in seen

    writer = TurnWriter(Recorder(), loop)  # type: ignore[arg-type]
    writer.write(b"head")
    writer.write(b"body")
    writer.close()
    await asyncio.sleep(0)  # the turn's flush finds nothing left
    assert seen == ["headbody", "close"]
    writer.write(b"late")
    await asyncio.sleep(0)
    assert seen == ["headbody", "close"]  # nothing is written to a closed transport


class RecordedTransport:
    """A transport keeping what reaches it, in order, with ``<close>`` where it was closed."""

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.out.append(bytes(data))

    def close(self) -> None:
        self.out.append(b"<close>")
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _answered_this_turn() -> tuple[asyncio.Protocol, RecordedTransport]:
    """A connection whose response to ``GET /a`` is complete but still held for this turn's end."""
    config = Config(app=ok, loop="asyncio", log_level="critical", access_log=False)
    config.load()
    protocol = read_deadline_protocol(head_timeout_s=10, body_timeout_s=30)(
        config=config, server_state=ServerState(), app_state={}
    )
    transport = RecordedTransport()
    protocol.connection_made(transport)  # type: ignore[arg-type]
    protocol.data_received(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
    await asyncio.sleep(0)  # the app's task answers; the writer holds the answer
    assert transport.out == []
    return protocol, transport


OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


async def test_a_shutdown_in_the_turn_of_a_response_sends_it_before_closing() -> None:
    protocol, transport = await _answered_this_turn()
    protocol.shutdown()  # type: ignore[attr-defined]
    await asyncio.sleep(0)
    assert transport.out == [OK, b"<close>"]


async def test_bad_bytes_after_a_response_of_the_same_turn_are_answered_after_it() -> None:
    protocol, transport = await _answered_this_turn()
    protocol.data_received(b"\x00\x01garbage\r\n\r\n")
    await asyncio.sleep(0)
    assert transport.out[0] == OK
    assert transport.out[1].startswith(b"HTTP/1.1 400 Bad Request") and transport.out[2:] == [b"<close>"]
