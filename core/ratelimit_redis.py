"""The Redis `RateLimiter`: GCRA in one Lua script, shared by every worker and API process.

The script reads the clock with the server's ``TIME`` so every process agrees on "now", stores
each key's theoretical arrival time with a ``PX`` expiry at the moment its bucket is full again
(so idle keys vanish), and mirrors `core.ratelimit.MemoryRateLimiter` arithmetic exactly.
Soft and elastic rules also touch a second key. `acquire_many` sends up to `CHUNK` requests
per EVALSHA and all chunks in one pipeline, so a batch costs one round trip; on Redis Cluster
all keys of a batch must share a hash slot (use ``{hash tags}`` in keys).

If Redis is unreachable the limiter fails open: it admits, counts each admission in
``clarion_ratelimit_fail_open_total{rule_id}``, warns once per outage, skips Redis for
``retry_interval_s`` and then tries again, so it recovers by itself.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any, cast

from prometheus_client import REGISTRY, CollectorRegistry, Counter
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.ratelimit import Allowed, GcraPlan, LimitDecision, RetryAfter, Rule, gcra_plan

log = logging.getLogger(__name__)

_UNREACHABLE = (RedisConnectionError, RedisTimeoutError, OSError)

# Decides a batch atomically at one server TIME. Request i uses KEYS[2i-1] (its key) and
# KEYS[2i] (soft: nominal shadow key, elastic/elastic_read: pool key, hard: unused) and ARGV[6i-5..6i]:
# interval_us, tau_us, cost, mode, secondary interval_us, secondary tau_us. Returns five
# integers per request: admitted, remaining, retry_after_ms, reset_after_ms, over_limit.
GCRA_LUA = """
local EPS = 1.0
local t = redis.call('TIME')
local now_s, now_us = tonumber(t[1]), tonumber(t[2])

local function ceil_ms(us)
  local ms = math.ceil((us - EPS) / 1000)
  if ms < 0 then return 0 end
  return ms
end
local function remaining(iv, ta, used)
  local r = math.floor((ta - used + EPS) / iv)
  if r < 0 then return 0 end
  return r
end
-- A TAT is stored as "<unix s> <us after that second>": a double holding ~1.8e15 us since the
-- epoch would lose fractions of a microsecond on every step of a long burst.
local function ahead_of(k)
  local v = redis.call('GET', k)
  if v then
    local s, us = string.match(v, '^(%d+) (.+)$')
    if s then
      local ahead = (tonumber(s) - now_s) * 1000000 + tonumber(us) - now_us
      if ahead > 0 then return ahead end
    end
  end
  return 0
end
local function store(k, used)
  local tat = string.format('%d %.17g', now_s, now_us + used)
  redis.call('SET', k, tat, 'PX', math.max(1, math.ceil(used / 1000)))
end

local function decide(key, s_key, interval, tau, cost, mode, s_interval, s_tau)
  local ahead = ahead_of(key)
  local used = ahead + cost * interval
  local admitted = used <= tau + EPS
  if admitted then store(key, used) end
  local rejected = {0, remaining(interval, tau, ahead), ceil_ms(used - tau), ceil_ms(ahead), 0}
  if mode == 'hard' then
    if admitted then return {1, remaining(interval, tau, used), 0, ceil_ms(used), 0} end
    return rejected
  end
  local s_ahead = ahead_of(s_key)
  local s_used = s_ahead + cost * s_interval
  local s_admits = s_used <= s_tau + EPS
  if mode == 'soft' then
    if not admitted then rejected[2] = 0; return rejected end
    if s_admits then
      store(s_key, s_used)
      return {1, remaining(s_interval, s_tau, s_used), 0, ceil_ms(s_used), 0}
    end
    return {1, 0, 0, ceil_ms(s_ahead), 1}
  end
  if mode == 'elastic_read' then
    if admitted then return {1, remaining(interval, tau, used), 0, ceil_ms(used), 0} end
    if s_admits then return {1, 0, 0, ceil_ms(ahead), 1} end
    return rejected
  end
  if admitted then
    store(s_key, math.min(s_used, s_tau))
    return {1, remaining(interval, tau, used), 0, ceil_ms(used), 0}
  end
  if s_admits then
    store(s_key, s_used)
    return {1, 0, 0, ceil_ms(ahead), 1}
  end
  return rejected
end

local out = {}
for i = 1, #KEYS / 2 do
  local a = (i - 1) * 6
  local d = decide(KEYS[2 * i - 1], KEYS[2 * i], tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]),
    tonumber(ARGV[a + 3]), ARGV[a + 4], tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]))
  for j = 1, 5 do out[#out + 1] = d[j] end
end
return out
"""
# Requests per EVALSHA: bounds how long one batch holds Redis (~2 us per request).
CHUNK = 500

FAIL_OPEN_METRIC = "clarion_ratelimit_fail_open_total"
_counters: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def fail_open_counter(registry: CollectorRegistry = REGISTRY) -> Counter:
    """The ``clarion_ratelimit_fail_open_total{rule_id}`` counter on ``registry``, registered at
    most once however many limiters (or re-imports of this module) ask for it."""
    counter = _counters.get(registry)
    if counter is None:
        try:
            counter = Counter(
                FAIL_OPEN_METRIC,
                "Rate-limit decisions admitted without checking because Redis was unreachable.",
                ["rule_id"],
                registry=registry,
            )
        except ValueError:  # registered by an earlier import of this module
            counter = cast(Counter, registry._names_to_collectors[FAIL_OPEN_METRIC])
        _counters[registry] = counter
    return counter


def _decisions(reply: list[Any]) -> list[LimitDecision]:
    values = [int(v) for v in reply]
    decisions: list[LimitDecision] = []
    for i in range(0, len(values), 5):
        admitted, remaining, retry_after_ms, reset_after_ms, over_limit = values[i : i + 5]
        if admitted:
            decisions.append(Allowed(remaining, reset_after_ms, bool(over_limit)))
        else:
            decisions.append(RetryAfter(retry_after_ms, reset_after_ms, remaining))
    return decisions


def _script_args(plan: GcraPlan) -> tuple[str, ...]:
    p, s = plan.primary, plan.secondary or plan.primary
    return (
        repr(p.interval_us),
        repr(p.tau_us),
        str(plan.cost),
        plan.mode,
        repr(s.interval_us),
        repr(s.tau_us),
    )


class RedisRateLimiter:
    """GCRA on Redis: decisions are atomic and agree across every process using ``prefix``.

    Fails open while Redis is unreachable (see module docstring).
    """

    def __init__(
        self,
        client: Redis,
        *,
        prefix: str = "clarion:rl:",
        registry: CollectorRegistry = REGISTRY,
        retry_interval_s: float = 1.0,
        owns_client: bool = False,
    ) -> None:
        self._redis = client
        self._prefix = prefix
        self._fail_open_total = fail_open_counter(registry)
        self._retry_interval_s = retry_interval_s
        self._owns_client = owns_client
        self._sha: str | None = None
        self._down_until = 0.0
        self._in_outage = False

    @classmethod
    def from_url(
        cls,
        redis_url: str,
        *,
        prefix: str = "clarion:rl:",
        registry: CollectorRegistry = REGISTRY,
        timeout_s: float = 0.25,
        retry_interval_s: float = 1.0,
        max_connections: int = 100,
        pool_wait_s: float = 5.0,
    ) -> RedisRateLimiter:
        """A limiter with its own pool of ``max_connections``; a call waits up to ``pool_wait_s``
        for a free connection, then at most about ``2 * timeout_s`` for Redis before failing
        open. Connects lazily."""
        # A pool that makes callers wait for a free connection: redis-py 8's default pool raises
        # MaxConnectionsError past 100 connections, which read as an outage and failed open (no
        # pacing at all) exactly when a worker's batch made hundreds of concurrent checks.
        pool: BlockingConnectionPool = BlockingConnectionPool.from_url(
            redis_url,
            max_connections=max_connections,
            timeout=pool_wait_s,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1),  # one reconnect for a stale pooled connection, no more
        )
        client = Redis.from_pool(pool)  # type: ignore[attr-defined]  # types-redis predates from_pool
        return cls(
            client, prefix=prefix, registry=registry, retry_interval_s=retry_interval_s, owns_client=True
        )

    async def acquire(self, key: str, rule: Rule, cost: int = 1) -> LimitDecision:
        """See `core.ratelimit.RateLimiter.acquire`; one round trip, fails open."""
        return (await self.acquire_many([(key, rule, cost)]))[0]

    async def acquire_many(self, requests: list[tuple[str, Rule, int]]) -> list[LimitDecision]:
        """See `core.ratelimit.RateLimiter.acquire_many`; one round trip. Each run of up to
        `CHUNK` requests is decided atomically at one server time, in order. Fails open as a whole."""
        if not requests:
            return []
        keys: list[str] = []
        args: list[str] = []
        for key, rule, cost in requests:
            plan = gcra_plan(key, rule, cost)
            keys += (self._prefix + key, self._prefix + (plan.secondary_key or key))
            args += _script_args(plan)
        if time.monotonic() < self._down_until:
            return self._fail_open(requests)
        try:
            reply = await self._eval_chunks(keys, args)
        except _UNREACHABLE as exc:
            return self._fail_open(requests, exc)
        if self._in_outage:
            self._in_outage = False
            log.warning("rate limiter: Redis reachable again, enforcing limits")
        return _decisions(reply)

    async def aclose(self) -> None:
        """Close the connection pool if this limiter created it."""
        if self._owns_client:
            await self._redis.aclose()  # type: ignore[attr-defined]  # types-redis predates aclose

    async def _eval_chunks(self, keys: list[str], args: list[str]) -> list[Any]:
        if self._sha is None:
            self._sha = await self._redis.script_load(GCRA_LUA)
        chunks = [
            (keys[2 * i : 2 * (i + CHUNK)], args[6 * i : 6 * (i + CHUNK)])
            for i in range(0, len(keys) // 2, CHUNK)
        ]
        if len(chunks) == 1:
            try:
                return cast(list[Any], await self._redis.evalsha(self._sha, len(keys), *keys, *args))
            except NoScriptError:  # script cache flushed (restart, SCRIPT FLUSH): load it again
                self._sha = await self._redis.script_load(GCRA_LUA)
                return cast(list[Any], await self._redis.evalsha(self._sha, len(keys), *keys, *args))
        results = await self._pipelined(chunks)
        missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError)]
        if missing:  # those chunks did not run; running them now keeps each one atomic
            self._sha = await self._redis.script_load(GCRA_LUA)
            for i, r in zip(missing, await self._pipelined([chunks[i] for i in missing]), strict=True):
                results[i] = r
        reply: list[Any] = []
        for r in results:
            if isinstance(r, BaseException):
                raise r
            reply += r
        return reply

    async def _pipelined(self, chunks: list[tuple[list[str], list[str]]]) -> list[Any]:
        assert self._sha is not None
        pipe = self._redis.pipeline(transaction=False)
        for keys, args in chunks:
            pipe.evalsha(self._sha, len(keys), *keys, *args)
        return cast(list[Any], await pipe.execute(raise_on_error=False))

    def _fail_open(
        self, requests: list[tuple[str, Rule, int]], exc: BaseException | None = None
    ) -> list[LimitDecision]:
        if exc is not None:
            self._down_until = time.monotonic() + self._retry_interval_s
            if not self._in_outage:
                self._in_outage = True
                log.warning("rate limiter: Redis unreachable (%r), admitting without limits", exc)
        for _, rule, _ in requests:
            self._fail_open_total.labels(rule_id=rule.rule_id).inc()
        return [Allowed(remaining=rule.limit, reset_after_ms=0) for _, rule, _ in requests]
