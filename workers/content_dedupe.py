"""Content-window dedupe: the same rendered content to the same user on the same channel, within
the tenant's ``content_dedupe_window_s``, is recorded ``duplicate`` (error code
``content_duplicate``, detail naming the first notification) and not sent.

"Same content" is `Renderer.content_hash` of subject, body and HTML for (user, channel). The
first notification to claim a hash owns it for the window; its own later attempts (retries,
delays, redeliveries) are never duplicates of themselves.

Two stores, picked by configuration:

- **Redis** (``CLARION_REDIS_URL`` set; a ``redis+cluster://`` URL for Redis Cluster, where each
  key is one command on its own slot): ``SET NX EX window`` on ``tenant:user:channel:hash``
  holding the owner's id; atomic across every worker. If the owner ended without being sent
  (throttled, failed, expired...), the next one takes the key over. If Redis is unreachable the
  gate lets the notification through (fails open, like the rate limiter).
- **PostgreSQL** (no Redis): under a transaction-scoped advisory lock on the same key, look for
  another notification of the user on the channel with that ``content_hash`` that is ``sent`` or
  ``sending`` and changed within the window, else stamp this one's ``content_hash``. The lock
  makes check-and-stamp atomic across workers.

What remains in both: the owner is claimed before it is sent, so if its send then fails for
good, a copy that arrived meanwhile was already recorded ``duplicate``.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

import asyncpg
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisClusterException, RedisError

from clarion.rules import RulesCache
from core.ratelimit_cluster import cluster_url
from core.render import RenderedContent, Renderer
from schema.enums import Status
from schema.ids import created_window
from workers.claim import ClaimedNotification
from workers.outcome import Outcome
from workers.recipients import Address

log = logging.getLogger(__name__)

_PG_FIRST = """
SELECT id FROM notifications
 WHERE user_id = $1 AND channel = $2 AND content_hash = $3 AND id <> $4
   AND status IN ('sent', 'sending') AND updated_at > now() - make_interval(secs => $5)
 ORDER BY created_at
 LIMIT 1
"""
# An owner in one of these states will never be sent: a copy may take its place.
_FINISHED_UNSENT = frozenset(
    {"failed", "suppressed", "throttled", "duplicate", "cancelled", "expired", "dead"}
)


class ContentDedupeGate:
    """Marks repeats of recently sent content ``duplicate`` (see module docstring)."""

    name = "content_dedupe"

    def __init__(
        self,
        *,
        rules: RulesCache,
        pool: asyncpg.Pool,
        renderer: Renderer,
        redis: Redis | RedisCluster | None = None,
        key_prefix: str = "clarion:cd:",
    ) -> None:
        self.rules = rules
        self.pool = pool
        self.renderer = renderer
        self.redis: Any = redis  # types-redis lacks the async RedisCluster commands
        self.key_prefix = key_prefix

    async def admit(
        self, row: ClaimedNotification, content: RenderedContent, addresses: list[Address]
    ) -> Outcome | None:
        """None to send (this notification now owns the content for the window), else ``duplicate``."""
        window_s = (await self.rules.current()).dedupe_window_s(row.tenant_id)
        if not window_s:
            return None
        digest = self.renderer.content_hash(content, recipient=str(row.user_id), channel=row.channel)
        key = f"{row.tenant_id}:{row.user_id}:{row.channel}:{digest}"
        if self.redis is not None:
            first = await self._claim_redis(key, row.id, window_s)
        else:
            first = await self._claim_pg(key, row, digest, window_s)
        if first is None:
            return None
        return Outcome(
            notification_id=row.id,
            status=Status.duplicate,
            error_code="content_duplicate",
            error_message=f"the same content reached this user on {row.channel} within "
            f"{window_s}s (notification {first})",
            detail=f"duplicate of {first}",
            content_hash=digest,
        )

    async def _claim_redis(self, key: str, nid: Any, window_s: int) -> str | None:
        assert self.redis is not None
        name, me = self.key_prefix + key, str(nid)
        try:
            if isinstance(self.redis, RedisCluster):  # topology first: redis-py's async cluster
                await self.redis.initialize()  # client, first used by several at once, broke a write
            if await self.redis.set(name, me, nx=True, ex=window_s):
                return None
            owner = await self.redis.get(name)
            holder = owner.decode() if isinstance(owner, bytes) else owner
            if holder is None or holder == me or await self._owner_gave_up(holder):
                await self.redis.set(name, me, ex=window_s)
                return None
            return holder
        except (RedisError, RedisClusterException, OSError) as exc:
            log.warning("content dedupe: Redis unavailable (%r); sending without the check", exc)
            return None

    async def _owner_gave_up(self, holder: str) -> bool:
        window = created_window([UUID(holder)])
        status = await self.pool.fetchval(
            "SELECT status FROM notifications WHERE id = $1::uuid AND created_at BETWEEN $2 AND $3",
            holder,
            *window,
        )
        return status in _FINISHED_UNSENT  # a row gone missing keeps its key until the window ends

    async def _claim_pg(self, key: str, row: ClaimedNotification, digest: str, window_s: int) -> str | None:
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key)
            first = await conn.fetchval(_PG_FIRST, row.user_id, row.channel, digest, row.id, window_s)
            if first is not None:
                return str(first)
            await conn.execute(
                "UPDATE notifications SET content_hash = $2 WHERE id = $1 AND created_at BETWEEN $3 AND $4",
                row.id, digest, *created_window([row.id]),
            )  # fmt: skip
        return None


def build_content_dedupe(
    *, rules: RulesCache, pool: asyncpg.Pool, redis_url: str | None, key_prefix: str = "clarion:"
) -> ContentDedupeGate:
    """The gate on Redis when ``redis_url`` is set, else on PostgreSQL (see module docstring)."""
    redis: Redis | RedisCluster | None = None
    if redis_url and (plain := cluster_url(redis_url)):
        redis = RedisCluster.from_url(
            plain, socket_timeout=0.25, socket_connect_timeout=0.25,
            retry=Retry(NoBackoff(), 1),  # type: ignore[arg-type]  # types-redis wants the sync Retry
        )  # fmt: skip
    elif redis_url:
        redis = Redis.from_url(redis_url, socket_timeout=0.25, socket_connect_timeout=0.25)
    return ContentDedupeGate(
        rules=rules, pool=pool, renderer=Renderer(), redis=redis, key_prefix=f"{key_prefix}cd:"
    )
