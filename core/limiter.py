"""The limiter factory: Redis (shared by every process) or in-process memory.

Apart from both implementations so neither imports the other (``core.ratelimit`` holds the rules,
the GCRA plan and the memory limiter; ``core.ratelimit_redis`` builds on them).
"""

from __future__ import annotations

from core.ratelimit import MemoryRateLimiter, RateLimiter
from core.ratelimit_redis import RedisRateLimiter


def build_rate_limiter(redis_url: str | None, *, prefix: str = "clarion:rl:") -> RateLimiter:
    """The Redis limiter (shared by all processes, fails open) when ``redis_url`` is given,
    else an in-process `MemoryRateLimiter`. Connects lazily, on first use."""
    if redis_url is None:
        return MemoryRateLimiter()
    return RedisRateLimiter.from_url(redis_url, prefix=prefix)
