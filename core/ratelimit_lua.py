"""The GCRA Lua script both Redis limiters run, and the wire format of its requests and replies.

`core.ratelimit_redis` (one Redis) and `core.ratelimit_cluster` (Redis Cluster) send the same
script; this module also packs requests into RESP bytes once per (rule, cost), because redis-py's
own command packing was the limiter's largest cost (see `PackedRequests`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from core.ratelimit import NOMINAL_SUFFIX, Allowed, GcraPlan, LimitDecision, RetryAfter, Rule, gcra_plan

# Decides a batch atomically at one server TIME. Request i uses KEYS[2i-1] (its key) and
# KEYS[2i] (soft: nominal shadow key, elastic/elastic_read: pool key, hard: unused) and ARGV[6i-5..6i]:
# interval_us, tau_us, cost, mode, secondary interval_us, secondary tau_us. Returns five
# integers per request: admitted, remaining, retry_after_ms, reset_after_ms, over_limit.
# Two modes serve `core.ratelimit_cluster`, where an elastic rule's pool may live on another node:
# ``peek`` answers whether the key's own GCRA would admit ``cost`` (first integer) and stores
# nothing; ``charge`` charges the key ``cost``, capped at full, as an elastic admission charges its pool.
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
-- Within one call every key is read at most once and written at most once, at the end: the
-- script is atomic, so nobody sees the states in between. Measured: 100 requests on one key took
-- 684 us of server time per EVALSHA with a GET and a SET each, which capped acquire_many at
-- ~146k/s with a whole core for Redis.
local aheads, stored, order = {}, {}, {}
local function ahead_of(k)
  local ahead = aheads[k]
  if ahead then return ahead end
  ahead = 0
  local v = redis.call('GET', k)
  if v then
    local s, us = string.match(v, '^(%d+) (.+)$')
    if s then
      ahead = math.max(0, (tonumber(s) - now_s) * 1000000 + tonumber(us) - now_us)
    end
  end
  aheads[k] = ahead
  return ahead
end
local function store(k, used)
  if not stored[k] then stored[k] = true; order[#order + 1] = k end
  aheads[k] = used
end
local function write_back()
  for _, k in ipairs(order) do
    local used = aheads[k]
    local tat = string.format('%d %.17g', now_s, now_us + used)
    -- as an integer: Redis writes a Lua number as %.17g, and 1e+17 ms is "not an integer"
    redis.call('SET', k, tat, 'PX', string.format('%d', math.max(1, math.ceil(used / 1000))))
  end
end

-- A cost of 0 is a look: the room under the nominal limit, nothing stored. A soft rule's room is
-- the lesser of its own and its shadow's, and its reset the shadow's debt or, when its own is the
-- tighter, the debt a nominal bucket would have to make the next event wait as long.
local function look(key, s_key, interval, tau, mode, s_interval, s_tau)
  local ahead = ahead_of(key)
  if mode ~= 'soft' then return {1, remaining(interval, tau, ahead), 0, ceil_ms(ahead), 0} end
  local s_ahead = ahead_of(s_key)
  local equivalent = math.max(s_ahead, ahead + interval - tau + s_tau - s_interval)
  local room = math.min(remaining(interval, tau, ahead), remaining(s_interval, s_tau, s_ahead))
  return {1, room, 0, ceil_ms(equivalent), 0}
end

local function decide(key, s_key, interval, tau, cost, mode, s_interval, s_tau)
  if cost == 0 and mode == 'charge' then return {1, 0, 0, 0, 0} end
  if cost == 0 and mode ~= 'peek' then return look(key, s_key, interval, tau, mode, s_interval, s_tau) end
  local ahead = ahead_of(key)
  local used = ahead + cost * interval
  if mode == 'peek' then return {used <= tau + EPS and 1 or 0, 0, 0, 0, 0} end
  if mode == 'charge' then store(key, math.min(used, tau)); return {1, 0, 0, 0, 0} end
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
write_back()
return out
"""
# Requests per EVALSHA: bounds how long one batch holds Redis (2-7 us per request).
CHUNK = 500

GCRA_SHA = hashlib.sha1(GCRA_LUA.encode()).hexdigest()


def script_args(plan: GcraPlan) -> tuple[str, ...]:
    """The six ARGV values of one request (see `GCRA_LUA`)."""
    p, s = plan.primary, plan.secondary or plan.primary
    return (
        repr(p.interval_us),
        repr(p.tau_us),
        str(plan.cost),
        plan.mode,
        repr(s.interval_us),
        repr(s.tau_us),
    )


def decisions(reply: list[Any]) -> list[LimitDecision]:
    """The decisions in a script reply (five integers per request)."""
    out: list[LimitDecision] = []
    for i in range(0, len(reply), 5):
        admitted, remaining, retry_after_ms, reset_after_ms, over_limit = reply[i : i + 5]
        if admitted:
            out.append(Allowed(int(remaining), int(reset_after_ms), bool(over_limit)))
        else:
            out.append(RetryAfter(int(retry_after_ms), int(reset_after_ms), int(remaining)))
    return out


def bulk(data: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(data), data)


class PackedRequests:
    """Requests as RESP fragments of an EVALSHA of `GCRA_LUA`, ready to be joined and sent.

    Measured with cProfile on ``bench.ratelimit`` (acquire_many x100): redis-py's ``pack_command``
    re-joins its growing buffer for each of the 803 arguments (quadratic) and was 57% of the
    client's time. Here a request's six arguments are packed once per
    (rule, cost) and its two keys once per request, and a batch is one ``bytes.join``.
    """

    _MAX_SHAPES = 4096  # distinct (rule, cost) pairs remembered; rules are few, costs small

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        # (rule, cost) -> (packed ARGV, fixed secondary key or None, suffix of the key otherwise)
        self._shapes: dict[tuple[Rule, int], tuple[bytes, str | None, str]] = {}

    def pack(self, key: str, rule: Rule, cost: int) -> tuple[bytes, bytes]:
        """The request's two packed KEYS and six packed ARGV; raises ValueError as `gcra_plan`."""
        shape = self._shapes.get((rule, cost))
        if shape is None:
            shape = self._shape(key, rule, cost)
        args, fixed_secondary, suffix = shape
        secondary = fixed_secondary if fixed_secondary is not None else key + suffix
        first = (self._prefix + key).encode()
        second = (self._prefix + secondary).encode()
        return b"$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(first), first, len(second), second), args

    def _shape(self, key: str, rule: Rule, cost: int) -> tuple[bytes, str | None, str]:
        plan = gcra_plan(key, rule, cost)
        args = b"".join(bulk(a.encode()) for a in script_args(plan))
        if plan.mode == "soft":
            shape: tuple[bytes, str | None, str] = (args, None, NOMINAL_SUFFIX)
        elif plan.mode == "hard":
            shape = (args, None, "")
        else:  # elastic: the pool's key whatever the key
            shape = (args, plan.secondary_key, "")
        if len(self._shapes) >= self._MAX_SHAPES:
            self._shapes.clear()
        self._shapes[(rule, cost)] = shape
        return shape


def evalsha(sha: str, keys: list[bytes], args: list[bytes]) -> bytes:
    """One packed ``EVALSHA sha 2n keys... args...`` of n packed requests."""
    n = len(keys)
    head = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % (3 + 8 * n, sha.encode())
    return b"".join((head, bulk(b"%d" % (2 * n)), *keys, *args))
