"""DNS lookups for tenants' hosts, so one tenant's slow DNS cannot starve another's.

``loop.getaddrinfo`` runs the blocking ``getaddrinfo`` on the event loop's default executor (6
threads on this 2-core machine), and ``asyncio.wait_for`` gives up on a lookup without freeing its
thread, which stays blocked until the system resolver gives up (seconds per nameserver). A
helper's probe (2026-11-28) made one tenant's host take 10 s to resolve: the sender's threads all
waited on it, and another tenant's deliveries, to a literal ``127.0.0.1``, failed as
``url_unresolvable``.

``Resolver`` runs lookups on threads of its own, at most ``per_key`` outstanding per key (the
tenant), counted until the thread is done, not until the caller gave up: a tenant whose lookups
hang is refused at once past that (``LookupBusy``) while every other tenant keeps its threads.
A literal address is never looked up (``ssrf.resolve``).
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

Lookup = Callable[[str, int], list[Any]]


def system_lookup(host: str, port: int) -> list[Any]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


class LookupBusy(Exception):
    """The key already has ``per_key`` lookups outstanding."""


class Resolver:
    """``getaddrinfo`` on ``threads`` threads of its own, at most ``per_key`` at once per key."""

    def __init__(self, *, threads: int, per_key: int, lookup: Lookup = system_lookup) -> None:
        self.per_key = per_key
        self._lookup = lookup
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="clarion-dns")
        self._outstanding: Counter[str] = Counter()

    def outstanding(self, key: str) -> int:
        return self._outstanding[key]

    async def getaddrinfo(self, host: str, port: int, *, key: str, timeout_s: float) -> list[Any]:
        """The addresses of ``host``; ``TimeoutError`` past ``timeout_s`` (the thread goes on and
        still counts against ``key``), ``LookupBusy`` when ``key`` has ``per_key`` outstanding."""
        if self._outstanding[key] >= self.per_key:
            raise LookupBusy(key)
        self._outstanding[key] += 1
        future = asyncio.get_running_loop().run_in_executor(self._pool, self._lookup, host, port)
        future.add_done_callback(partial(self._done, key))
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)

    def _done(self, key: str, future: asyncio.Future[Any]) -> None:
        if not future.cancelled():
            future.exception()  # retrieved: a lookup given up on may still fail later
        self._outstanding[key] -= 1
        if not self._outstanding[key]:
            del self._outstanding[key]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
