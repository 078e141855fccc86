"""The Redis Cluster `RateLimiter`: the GCRA script of `core.ratelimit_lua`, one EVALSHA per slot.

Redis Cluster runs a script only on keys of one hash slot. Every key is stored as
``prefix{tag}name``, ``tag`` a digest of the name without its ``|nominal`` suffixes, so a key and
its soft shadow share a slot and every process maps a name to the same slot. A batch is grouped
by slot: one EVALSHA per slot (up to `CHUNK` requests each), all slots at once, each slot's
requests in batch order. Requests on different slots share no key, so the decisions are those of
sequential `acquire` calls, as on one Redis.

An elastic rule's pool is usually on another slot than its key:

- a *read-only* pool (what ``workers.throttle`` uses): the key is decided as a hard rule in its
  slot and the pool *peeked* (would it admit ``cost``? nothing stored) in the pool's slot, in
  batch order there, in the same round trip; borrowing stores nothing on either key, so the
  combined answer is the one-Redis answer;
- a pool the rule charges: the pool's step depends on the key's answer, so the batch is cut
  there and that request takes two more round trips (key, then charge or borrow on the pool).

Fails open per node: a node that does not answer has its requests admitted and counted in
``clarion_ratelimit_fail_open_total{rule_id}`` and is skipped for ``retry_interval_s``; the other
nodes keep enforcing.

Configure with a ``redis+cluster://host:port`` (or ``rediss+cluster://``) URL naming any node.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any, Unpack

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ClusterError, NoScriptError, RedisClusterException, ResponseError

from core.ratelimit import NOMINAL_SUFFIX, Allowed, GcraPlan, LimitDecision, Rule, gcra_plan
from core.ratelimit_fail_open import UNREACHABLE, FailingOpenLimiter, LimiterOptions
from core.ratelimit_lua import CHUNK, GCRA_LUA, GCRA_SHA, decisions, script_args

CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
_NODE_FAILURES: tuple[type[BaseException], ...] = (*UNREACHABLE, ClusterError, RedisClusterException)

# One script request: its keys and ARGV, and how its answer is used ("whole" is the decision;
# "key"/"peek" are the two halves of an elastic request with a read-only pool on another slot).
_Op = tuple[int, str, list[str], list[str]]


def cluster_url(url: str) -> str | None:
    """The plain ``redis://`` URL of a ``redis+cluster://`` one; None for any other URL."""
    scheme, sep, rest = url.partition("://")
    plain = CLUSTER_SCHEMES.get(scheme.lower())
    return f"{plain}://{rest}" if sep and plain else None


class RedisClusterRateLimiter(FailingOpenLimiter):
    """GCRA on Redis Cluster, deciding exactly as `core.ratelimit_redis.RedisRateLimiter`."""

    def __init__(
        self, client: RedisCluster, *, owns_client: bool = False, **options: Unpack[LimiterOptions]
    ) -> None:
        super().__init__(owns_client=owns_client, **options)
        if "{" in self._prefix or "}" in self._prefix:  # the first {...} of a key is its hash tag
            raise ValueError(f"a Redis Cluster key prefix cannot contain braces: {self._prefix!r}")
        self._cluster: Any = client  # types-redis predates redis-py's async cluster scripting

    @classmethod
    def from_url(
        cls, url: str, *, timeout_s: float = 0.25, **options: Unpack[LimiterOptions]
    ) -> RedisClusterRateLimiter:
        """A limiter on the cluster one of whose nodes ``url`` (``redis+cluster://``) names; a call
        waits at most about ``2 * timeout_s`` for a node before failing open. Connects lazily."""
        plain = cluster_url(url)
        if plain is None:
            raise ValueError(f"not a redis+cluster:// URL: {url!r}")
        client: RedisCluster = RedisCluster.from_url(
            plain,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # one retry (after a topology refresh), no backoff: redis-py's default backs off up to
            # seconds, and a limiter must fail open quickly instead
            retry=Retry(NoBackoff(), 1),  # type: ignore[arg-type]  # types-redis wants the sync Retry
        )
        return cls(client, owns_client=True, **options)

    def storage_key(self, name: str) -> str:
        """The Redis key of a limiter key (or of its ``|nominal`` shadow)."""
        base = name
        while base.endswith(NOMINAL_SUFFIX):  # a key named "x|nominal" has its shadow on x's slot too
            base = base.removesuffix(NOMINAL_SUFFIX)
        tag = hashlib.blake2b(base.encode(), digest_size=6).hexdigest()
        return f"{self._prefix}{{{tag}}}{name}"

    async def acquire(self, key: str, rule: Rule, cost: int = 1) -> LimitDecision:
        """See `core.ratelimit.RateLimiter.acquire`; one round trip, fails open."""
        return (await self.acquire_many([(key, rule, cost)]))[0]

    async def acquire_many(self, requests: list[tuple[str, Rule, int]]) -> list[LimitDecision]:
        """See `core.ratelimit.RateLimiter.acquire_many`; one round trip per slot, all at once,
        unless an elastic rule charges a pool on another slot (see module docstring)."""
        plans = [gcra_plan(key, rule, cost) for key, rule, cost in requests]
        rules = [rule for _, rule, _ in requests]
        out: list[LimitDecision | None] = [None] * len(requests)
        segment: list[_Op] = []
        for i, ((key, _, _), plan) in enumerate(zip(requests, plans, strict=True)):
            primary = self.storage_key(key)
            secondary = self.storage_key(plan.secondary_key or key)
            if plan.mode.startswith("elastic") and _slot(primary) != _slot(secondary):
                if plan.mode == "elastic":  # the pool's step depends on the key's answer
                    await self._run(segment, rules, out)
                    segment = []
                    out[i] = await self._charge_elsewhere(i, primary, secondary, plan, rules)
                    continue
                segment.append((i, "key", [primary, primary], _args(plan, "hard", on_pool=False)))
                segment.append((i, "peek", [secondary, secondary], _args(plan, "peek", on_pool=True)))
            else:
                segment.append((i, "whole", [primary, secondary], list(script_args(plan))))
        await self._run(segment, rules, out)
        decided = [d for d in out if d is not None]
        assert len(decided) == len(requests), "every request is decided or failed open"
        return decided

    async def aclose(self) -> None:
        """Close the cluster client if this limiter created it."""
        if self._owns_client:
            await self._cluster.aclose()

    async def _charge_elsewhere(
        self, i: int, primary: str, pool: str, plan: GcraPlan, rules: list[Rule]
    ) -> LimitDecision:
        own: list[LimitDecision | None] = [None]
        if await self._run(
            [(0, "whole", [primary, primary], _args(plan, "hard", on_pool=False))], [rules[i]], own
        ):
            return own[0] or Allowed(rules[i].limit, 0)  # failed open: charge nothing more
        decided = own[0]
        assert decided is not None
        step: list[LimitDecision | None] = [None]
        mode = "charge" if isinstance(decided, Allowed) else "hard"  # hard on the pool: borrow
        await self._run([(0, "whole", [pool, pool], _args(plan, mode, on_pool=True))], [rules[i]], step)
        if isinstance(decided, Allowed) or not step[0]:
            return decided  # charged the pool, or neither the key nor the pool admits
        return Allowed(0, decided.reset_after_ms, over_limit=True)

    async def _run(self, ops: list[_Op], rules: list[Rule], out: list[LimitDecision | None]) -> set[int]:
        """Decide ``ops`` (one EVALSHA per slot, slots concurrently) into ``out``; returns the
        requests admitted because their node failed."""
        if not ops:
            return set()
        by_slot: dict[int, list[_Op]] = {}
        for op in ops:
            by_slot.setdefault(_slot(op[2][0]), []).append(op)
        slots = list(by_slot)
        try:  # read the topology before the concurrent commands: redis-py's async cluster client,
            # first used by several at once, closed a connection under another's write
            await self._cluster.initialize()
        except _NODE_FAILURES as exc:
            everyone = {i for i, *_ in ops}
            for i in everyone:
                out[i] = self._fail_open.admit([rules[i]], exc)[0]
            return everyone
        replies = await asyncio.gather(*(self._eval_slot(by_slot[s]) for s in slots), return_exceptions=True)
        failed: dict[int, tuple[BaseException, str]] = {}
        halves: dict[int, dict[str, LimitDecision]] = {}
        for slot, reply in zip(slots, replies, strict=True):
            node = self._node_name(slot)
            if isinstance(reply, BaseException):
                if not isinstance(reply, _NODE_FAILURES):
                    raise reply
                failed.update((op[0], (reply, node)) for op in by_slot[slot])
                continue
            self._fail_open.reachable(node)
            for (i, part, _, _), decision in zip(by_slot[slot], reply, strict=True):
                halves.setdefault(i, {})[part] = decision
        for i, parts in halves.items():
            if i in failed:
                continue
            if "whole" in parts:
                out[i] = parts["whole"]
            else:  # elastic with a read-only pool elsewhere: borrow iff the key rejects and the pool admits
                own = parts["key"]
                out[i] = own if own or not parts["peek"] else Allowed(0, own.reset_after_ms, over_limit=True)
        for i, (error, node) in failed.items():
            first = not self._fail_open.skipping(node)  # only a fresh failure restarts the skip window
            out[i] = self._fail_open.admit([rules[i]], error if first else None, node)[0]
        return set(failed)

    async def _eval_slot(self, ops: list[_Op]) -> list[LimitDecision]:
        node = self._node_name(_slot(ops[0][2][0]))
        if node and self._fail_open.skipping(node):
            raise RedisClusterException(f"node {node} failed less than a retry interval ago")
        out: list[LimitDecision] = []
        for start in range(0, len(ops), CHUNK):
            chunk = ops[start : start + CHUNK]
            keys = [k for op in chunk for k in op[2]]
            args = [a for op in chunk for a in op[3]]
            try:
                reply = await self._cluster.evalsha(GCRA_SHA, len(keys), *keys, *args)
            except NoScriptError:  # a new or restarted node: the chunk did not run. EVAL runs it on
                # this slot's node and caches the script there (SCRIPT LOAD would go to every node)
                reply = await self._cluster.eval(GCRA_LUA, len(keys), *keys, *args)
            out += decisions(reply)
        return out

    def _node_name(self, slot: int) -> str:
        try:
            return str(self._cluster.nodes_manager.get_node_from_slot(slot).name)
        except (RedisClusterException, ResponseError, IndexError, KeyError):  # topology not read yet
            return ""


def _slot(key: str) -> int:
    return int(key_slot(key.encode()))


def _args(plan: GcraPlan, mode: str, *, on_pool: bool) -> list[str]:
    """ARGV running one half of an elastic plan alone in ``mode``: on the key with its own
    parameters, or on the pool with the pool's."""
    p = plan.secondary if on_pool and plan.secondary is not None else plan.primary
    return [repr(p.interval_us), repr(p.tau_us), str(plan.cost), mode, repr(p.interval_us), repr(p.tau_us)]
