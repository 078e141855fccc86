"""The Redis `RateLimiter`: GCRA in one Lua script, shared by every worker and API process.

The script (`core.ratelimit_lua`) reads the clock with the server's ``TIME`` so every process
agrees on "now", stores each key's theoretical arrival time with a ``PX`` expiry at the moment its
bucket is full again (so idle keys vanish), and mirrors `core.ratelimit_memory.MemoryRateLimiter`
arithmetic exactly. Soft and elastic rules also touch a second key. `acquire_many` sends up to
`CHUNK` requests per EVALSHA and all chunks in one write, so a batch costs one round trip.
Concurrent `acquire` calls made in the same event-loop turn share one EVALSHA, in call order. For
Redis Cluster see `core.ratelimit_cluster`.

If Redis is unreachable the limiter fails open: it admits, counts each admission in
``clarion_ratelimit_fail_open_total{rule_id}``, warns once per outage, skips Redis for
``retry_interval_s`` and then tries again, so it recovers by itself.
"""

from __future__ import annotations

import asyncio
from typing import Any, Unpack

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from core.ratelimit import LimitDecision, Rule
from core.ratelimit_fail_open import UNREACHABLE, FailingOpenLimiter, LimiterOptions
from core.ratelimit_lua import CHUNK, GCRA_LUA, PackedRequests, decisions, evalsha


class RedisOptions(LimiterOptions, total=False):
    """`LimiterOptions` and the connection pool's."""

    max_connections: int
    """Connections at most (default 100)."""
    pool_wait_s: float
    """How long a call waits for a free connection before failing open (default 5 s)."""


class RedisRateLimiter(FailingOpenLimiter):
    """GCRA on Redis: decisions are atomic and agree across every process using ``prefix``.

    Fails open while Redis is unreachable (see module docstring and `core.ratelimit_fail_open`).
    """

    def __init__(
        self,
        client: Redis,
        *,
        owns_client: bool = False,
        max_connections: int = 100,
        pool_wait_s: float = 5.0,
        **options: Unpack[LimiterOptions],
    ) -> None:
        super().__init__(owns_client=owns_client, **options)
        self._redis = client
        self._packed = PackedRequests(self._prefix)
        self._sha: str | None = None
        # Own connections made by the client's pool, not checked out of it per call: in cProfile
        # of bench.ratelimit's single calls (50 tasks), BlockingConnectionPool's get_connection and
        # release (condition, timeout, health check, metrics) were 29% of the client's time.
        self._idle: list[AbstractConnection] = []
        self._connections: set[AbstractConnection] = set()  # idle or in use
        self._slots = asyncio.Semaphore(max_connections)
        self._pool_wait_s = pool_wait_s
        self._pending: list[tuple[bytes, bytes, Rule, asyncio.Future[LimitDecision]]] = []
        self._flushes: set[asyncio.Task[None]] = set()

    @classmethod
    def from_url(
        cls, redis_url: str, *, timeout_s: float = 0.25, **options: Unpack[RedisOptions]
    ) -> RedisRateLimiter:
        """A limiter with up to ``max_connections`` connections; a call waits up to ``pool_wait_s``
        for a free one, then at most about ``2 * timeout_s`` for Redis before failing open.
        Connects lazily."""
        pool: BlockingConnectionPool = BlockingConnectionPool.from_url(
            redis_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
        )
        client = Redis.from_pool(pool)  # type: ignore[attr-defined]  # types-redis predates from_pool
        return cls(client, owns_client=True, **options)

    async def acquire(self, key: str, rule: Rule, cost: int = 1) -> LimitDecision:
        """See `core.ratelimit.RateLimiter.acquire`; fails open. Calls made in the same event-loop
        turn go in one EVALSHA, decided in call order."""
        keys, args = self._packed.pack(key, rule, cost)
        if self._fail_open.skipping():
            return self._fail_open.admit([rule])[0]
        # Coalescing: 50 tasks calling acquire made 50 EVALSHAs of one request each (2,400-6,700/s
        # in bench.ratelimit); one EVALSHA per loop turn carries them all (61,000-97,000/s).
        future = asyncio.get_running_loop().create_future()
        self._pending.append((keys, args, rule, future))
        if len(self._pending) == 1:  # the first caller of this turn schedules the flush
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    async def acquire_many(self, requests: list[tuple[str, Rule, int]]) -> list[LimitDecision]:
        """See `core.ratelimit.RateLimiter.acquire_many`; one round trip. Each run of up to
        `CHUNK` requests is decided atomically at one server time, in order. Fails open as a whole."""
        if not requests:
            return []
        keys: list[bytes] = []
        args: list[bytes] = []
        for key, rule, cost in requests:
            packed_keys, packed_args = self._packed.pack(key, rule, cost)
            keys.append(packed_keys)
            args.append(packed_args)
        return await self._decide(keys, args, [rule for _, rule, _ in requests])

    async def aclose(self) -> None:
        """Close this limiter's connections, and the client if this limiter created it."""
        self._idle = []
        for conn in self._connections:
            await conn.disconnect()
        self._connections.clear()
        if self._owns_client:
            await self._redis.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._decide_for(batch))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def _decide_for(
        self, batch: list[tuple[bytes, bytes, Rule, asyncio.Future[LimitDecision]]]
    ) -> None:
        try:
            results = await self._decide([b[0] for b in batch], [b[1] for b in batch], [b[2] for b in batch])
        except BaseException as exc:  # every waiting caller gets it, as a lone call would
            for *_, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):  # cancelled: the task itself must end so
                raise
            return
        for (*_, future), decision in zip(batch, results, strict=True):
            if not future.done():  # its caller was cancelled
                future.set_result(decision)

    async def _decide(self, keys: list[bytes], args: list[bytes], rules: list[Rule]) -> list[LimitDecision]:
        if self._fail_open.skipping():
            return self._fail_open.admit(rules)
        try:
            reply = await self._eval_chunks(keys, args)
        except UNREACHABLE as exc:
            return self._fail_open.admit(rules, exc)
        self._fail_open.reachable()
        return decisions(reply)

    async def _eval_chunks(self, keys: list[bytes], args: list[bytes]) -> list[Any]:
        if self._sha is None:
            self._sha = await self._redis.script_load(GCRA_LUA)
        spans = [(i, i + CHUNK) for i in range(0, len(keys), CHUNK)]
        results = await self._round_trip([evalsha(self._sha, keys[a:b], args[a:b]) for a, b in spans])
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:  # script cache flushed (restart, SCRIPT FLUSH): those chunks did not run
            self._sha = await self._redis.script_load(GCRA_LUA)
            again = [evalsha(self._sha, keys[a:b], args[a:b]) for a, b in (spans[i] for i in missing)]
            for i, r in zip(missing, await self._round_trip(again), strict=True):
                results[i] = r
        reply: list[Any] = []
        for r in results:
            if isinstance(r, BaseException):
                raise r
            reply += r
        return reply

    async def _round_trip(self, commands: list[bytes]) -> list[Any]:
        """Send packed commands in one write and read one reply each (a ResponseError as a value).
        A pooled connection found closed reconnects once, as redis-py's one-retry pool did."""
        try:
            await asyncio.wait_for(self._slots.acquire(), self._pool_wait_s)
        except TimeoutError:
            raise RedisConnectionError("no connection available") from None
        if self._idle:
            conn = self._idle.pop()
        else:
            conn = self._redis.connection_pool.make_connection()
            self._connections.add(conn)
        reused = conn.is_connected
        try:
            try:
                replies = await _exchange(conn, commands)
            except RedisConnectionError:
                if not reused:
                    raise
                await conn.disconnect()
                replies = await _exchange(conn, commands)  # on a new socket: the pooled one was stale
        except BaseException:
            # a reply may be half read: the connection is unusable; after an outage every idle one
            # is dead too
            dropped, self._idle = [conn, *self._idle], []
            self._connections.difference_update(dropped)
            for dead in dropped:
                await dead.disconnect()
            raise
        finally:
            self._slots.release()
        self._idle.append(conn)
        return replies


async def _exchange(conn: AbstractConnection, commands: list[bytes]) -> list[Any]:
    await conn.send_packed_command(b"".join(commands), check_health=False)
    replies: list[Any] = []
    for _ in commands:
        try:
            replies.append(await conn.read_response())
        except ResponseError as exc:  # this command failed, the connection is fine
            replies.append(exc)
    return replies
