"""DNS lookups for tenants' hosts, so one tenant's slow DNS cannot starve another's.

``loop.getaddrinfo`` runs the blocking ``getaddrinfo`` on the event loop's default executor (6
threads on this 2-core machine), and ``asyncio.wait_for`` gives up on a lookup without freeing its
thread, which stays blocked until the system resolver gives up (seconds per nameserver). A
helper's probe (2026-11-28) made one tenant's host take 10 s to resolve: the sender's threads all
waited on it, and another tenant's deliveries failed as ``url_unresolvable`` (3 of 60 to a
literal ``127.0.0.1``, 39 of 60 to a name).

``Resolver`` runs lookups on threads of its own and counts them until their thread is done, not
until the caller gave up: at most ``per_host`` outstanding for one host of a key (the tenant) and
``per_key`` for the key, past which a lookup is refused at once (``LookupBusy``). A slow host
then holds at most ``per_host`` threads and its tenant at most ``per_key``, while the tenant's
other hosts and every other tenant keep theirs. A lookup still waiting for a thread when its
caller gives up is cancelled, so it never holds one. What is left: as many tenants with hanging
DNS as fill ``threads`` with ``per_key`` each (32 with the sender's 128 and 4) make the others'
named lookups wait for a thread (a literal address is never looked up, ``ssrf.resolve``).
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

Lookup = Callable[[str, int], list[Any]]


def system_lookup(host: str, port: int) -> list[Any]:
    return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)


class LookupBusy(Exception):
    """The host (or its key) already has its share of lookups outstanding."""

    def __init__(self, host: str, *, host_busy: bool) -> None:
        super().__init__(host)
        self.host_busy = host_busy


class Resolver:
    """``getaddrinfo`` on ``threads`` threads of its own, at most ``per_host`` outstanding for one
    host of a key and ``per_key`` for the key."""

    def __init__(self, *, threads: int, per_key: int, per_host: int, lookup: Lookup = system_lookup) -> None:
        self.per_key = per_key
        self.per_host = per_host
        self._lookup = lookup
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="clarion-dns")
        self._by_key: Counter[str] = Counter()
        self._by_host: Counter[tuple[str, str]] = Counter()

    def outstanding(self, key: str) -> int:
        return self._by_key[key]

    async def getaddrinfo(self, host: str, port: int, *, key: str, timeout_s: float) -> list[Any]:
        """The addresses of ``host``; ``TimeoutError`` past ``timeout_s`` (a lookup already on a
        thread goes on and still counts), ``LookupBusy`` when the host or the key has its share."""
        if self._by_host[key, host] >= self.per_host:
            raise LookupBusy(host, host_busy=True)
        if self._by_key[key] >= self.per_key:
            raise LookupBusy(host, host_busy=False)
        self._by_key[key] += 1
        self._by_host[key, host] += 1
        loop = asyncio.get_running_loop()
        submitted = self._pool.submit(self._lookup, host, port)
        # The count drops when the thread is done, or at once for a lookup cancelled unstarted.
        submitted.add_done_callback(partial(self._from_thread, loop, key, host))
        answer = asyncio.wrap_future(submitted)
        answer.add_done_callback(_retrieve)
        try:
            return await asyncio.wait_for(asyncio.shield(answer), timeout_s)
        except TimeoutError:
            submitted.cancel()  # only takes when no thread has started it
            raise

    def _from_thread(self, loop: asyncio.AbstractEventLoop, key: str, host: str, _: Future[Any]) -> None:
        try:
            loop.call_soon_threadsafe(self._done, key, host)
        except RuntimeError:  # the loop is closed: nothing is left to count
            pass

    def _done(self, key: str, host: str) -> None:
        self._by_key[key] -= 1
        if not self._by_key[key]:
            del self._by_key[key]
        self._by_host[key, host] -= 1
        if not self._by_host[key, host]:
            del self._by_host[key, host]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _retrieve(answer: asyncio.Future[Any]) -> None:
    """Mark a lookup's outcome as seen: one given up on may still fail later, unawaited."""
    if not answer.cancelled():
        answer.exception()
