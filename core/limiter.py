"""The limiter factory: Redis Cluster, one Redis (both shared by every process) or in-process memory.

Apart from the implementations so none imports another (``core.ratelimit`` holds the rules and the
GCRA plan; ``core.ratelimit_memory``, ``core.ratelimit_redis`` and ``core.ratelimit_cluster``
build on them).
"""

from __future__ import annotations

from core.ratelimit import RateLimiter
from core.ratelimit_cluster import RedisClusterRateLimiter, cluster_url
from core.ratelimit_memory import MemoryRateLimiter
from core.ratelimit_redis import RedisRateLimiter


def build_rate_limiter(redis_url: str | None, *, prefix: str = "clarion:rl:") -> RateLimiter:
    """The Redis Cluster limiter for a ``redis+cluster://`` URL, the Redis limiter for another
    URL (both shared by all processes, failing open), else an in-process `MemoryRateLimiter`.
    Connects lazily, on first use."""
    if redis_url is None:
        return MemoryRateLimiter()
    if cluster_url(redis_url) is not None:
        return RedisClusterRateLimiter.from_url(redis_url, prefix=prefix)
    return RedisRateLimiter.from_url(redis_url, prefix=prefix)
