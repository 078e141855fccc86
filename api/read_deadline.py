"""Deadlines for reading a request: its head within ``CLARION_API_HEAD_TIMEOUT_S`` of its first byte
(or of the connection opening), its body within ``CLARION_API_BODY_TIMEOUT_S`` of the head.

uvicorn times nothing until a first response is complete: a connection that sends nothing, or
trickles one header byte every few seconds, stays open for ever (its keep-alive timer starts after
a response and stops at the next byte). Each such connection costs the API a file descriptor, and
the process has a fixed number (20,000 here): one client holding that many idle connections would
leave the API accepting no one, every tenant alike. A body trickled after its head held a request task
the same way.

Past the head's deadline the connection is answered ``408 request_timeout`` in the API's error
shape and closed. Past the body's, it is closed: the route is already waiting in ``receive()``,
which reports the disconnect, and no partial answer can be written under it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from api.head_limit import closing_answer
from api.pipelining import PipelineLimitedProtocol

_RESPONSE = closing_answer(
    "408 Request Timeout", "request_timeout", "The request head did not arrive in time."
)


class ReadDeadlineProtocol(PipelineLimitedProtocol):
    """``PipelineLimitedProtocol`` with a deadline on each request's head and on its body."""

    head_timeout_s = 10.0
    body_timeout_s = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.head_timeout_s, self._head_late)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None and self._in_head:  # the first byte of the next request
            self._arm(self.head_timeout_s, self._head_late)
        super().data_received(data)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout_s, self._body_late)

    def on_message_complete(self) -> None:
        self._disarm()  # the keep-alive timer takes over once the answer is written
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete:
            # Answered before its body was read (a 401 or 404 that needs no body): the body's bytes
            # stopped uvicorn's keep-alive timer after the answer, and none would start again.
            self._arm(self.head_timeout_s, self._head_late)

    def _arm(self, delay_s: float, late: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_late(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.close_with(_RESPONSE)

    def _body_late(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.close_with()


def read_deadline_protocol(*, head_timeout_s: float, body_timeout_s: float) -> type[ReadDeadlineProtocol]:
    """The protocol class uvicorn builds each connection with, holding these deadlines."""
    return type(
        "ReadDeadlineProtocol",
        (ReadDeadlineProtocol,),
        {"head_timeout_s": head_timeout_s, "body_timeout_s": body_timeout_s},
    )
