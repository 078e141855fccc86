"""The Redis limiter fails open while Redis is unreachable (counted, warned once) and enforces again,
with the state kept in Redis, once it returns."""

from __future__ import annotations

import asyncio
import logging

import pytest
from prometheus_client import CollectorRegistry

from core.ratelimit import Allowed, RetryAfter, Rule
from core.ratelimit_fail_open import FAIL_OPEN_METRIC
from core.ratelimit_redis import RedisRateLimiter
from harness.services import wait_until
from tests.fixtures.ratelimit import HOURLY
from tests.fixtures.redis_limiter import prefix_fixture, redis_fixture  # noqa: F401 - fixtures


async def test_unreachable_redis_fails_open_counts_and_warns_once(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    limiter = RedisRateLimiter.from_url("redis://127.0.0.1:1", registry=registry, retry_interval_s=0)
    caplog.set_level(logging.WARNING, logger="core.ratelimit_fail_open")

    single = [await limiter.acquire("k", HOURLY) for _ in range(20)]
    batch = await limiter.acquire_many([("k", HOURLY, 1), ("k", Rule("other", 1, 1.0), 1)])
    concurrent = await asyncio.gather(*(limiter.acquire("k", HOURLY) for _ in range(5)))

    assert all(isinstance(d, Allowed) for d in single + batch + list(concurrent))
    assert registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": "hourly"}) == 26
    assert registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": "other"}) == 1
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1
    await limiter.aclose()


class TcpProxy:
    """Forwards a local port to Redis; stopping it makes Redis unreachable for the client."""

    def __init__(self) -> None:
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        self._writers.clear()
        await self._server.wait_closed()

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        redis_reader, redis_writer = await asyncio.open_connection("127.0.0.1", 6379)
        self._writers += [client_writer, redis_writer]

        async def pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        await asyncio.gather(pump(client_reader, redis_writer), pump(redis_reader, client_writer))


async def test_recovers_when_redis_returns(prefix: str) -> None:
    proxy = TcpProxy()
    await proxy.start()
    registry = CollectorRegistry()
    limiter = RedisRateLimiter.from_url(
        f"redis://127.0.0.1:{proxy.port}/0", prefix=prefix, registry=registry, retry_interval_s=0.05
    )
    rule = Rule("recovery", limit=2, period_s=3600.0)
    assert [bool(await limiter.acquire("k", rule)) for _ in range(3)] == [True, True, False]

    await proxy.stop()
    during_outage = [await limiter.acquire("k", rule) for _ in range(5)]
    await proxy.start()
    await wait_until(lambda: not limiter._fail_open.skipping(), timeout_s=1.0, interval_s=0.01)
    after = await limiter.acquire("k", rule)

    assert all(isinstance(d, Allowed) for d in during_outage)
    assert registry.get_sample_value(FAIL_OPEN_METRIC, {"rule_id": "recovery"}) == 5
    assert isinstance(after, RetryAfter)  # enforcing again, with the state kept in Redis
    await limiter.aclose()
    await proxy.stop()
