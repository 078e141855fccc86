"""The rate-limit rules and content-dedupe windows every process enforces, cached from the DB.

`RulesCache.current()` returns a `Snapshot` at most ``ttl_s`` old (2 s by default): a rule
created, changed, disabled or deleted through ``/v1/rate-limits`` is enforced by every API and
worker process on its first decision after that, without a restart. A refresh is one small query
(enabled rules + tenants with a dedupe window) made by whichever caller finds the snapshot stale;
concurrent callers wait for that one query instead of issuing their own.

How a DB rule maps to a `core.ratelimit.Rule` (key per rule id, so rules never share state):

- ``tenant`` / ``api_key`` / ``provider``: a rate: ``limit`` per ``period_s`` on average, up to
  ``limit + burst`` at once (GCRA).
- ``recipient``: a frequency cap: never more than ``limit`` in any window of ``period_s``. GCRA
  enforces that as a bucket of ``limit`` refilled one message per ``period_s``: exact for the
  first window after a quiet spell, and stricter than a sliding window under sustained traffic
  (never looser).

Modes: ``hard`` and ``soft`` as in `core.ratelimit`. An ``elastic`` rule (recipient scope
only, see `api.rate_limits`) is hard on its own key and borrows from the spare capacity of a pool
its caller passes to `RuleSpec.to_rule`: the worker passes the provider pacing key the
notification was just charged to (`workers.throttle`). Without a pool (no pacing rule applies)
there is nothing to borrow from, and the rule is enforced as ``hard``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast
from uuid import UUID

import asyncpg

from clarion import metrics
from clarion.rule_names import rule_label
from core.ratelimit import ElasticPool, InvalidRule, Rule, check_rule_parameters

log = logging.getLogger(__name__)

REFRESH_TTL_S = 2.0

RULES_SQL = """
SELECT id, tenant_id, name, scope, channel, category, provider, "limit", period_s, burst, mode,
       overshoot_pct, action
  FROM rate_limit_rules
 WHERE enabled
"""
WINDOWS_SQL = "SELECT id, content_dedupe_window_s FROM tenants WHERE content_dedupe_window_s > 0"

Fetch = Callable[[str], Awaitable[Sequence[Mapping[str, Any]]]]


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """One enabled row of ``rate_limit_rules``; ``tenant_id`` None applies to every tenant."""

    id: UUID
    tenant_id: str | None
    name: str
    scope: str
    channel: str | None
    category: str | None
    provider: str | None
    limit: int
    period_s: float
    burst: int
    mode: str
    overshoot_pct: float
    action: str

    @property
    def label(self) -> str:
        """What metrics and outcome details call the rule: its name, else (none, or one stored
        before names were checked) its id; `clarion.rule_names`."""
        return rule_label(name=self.name, rule_id=self.id)

    @property
    def metric_label(self) -> str:
        """What the rule is called in metric labels: a global rule (set by the operator) by its
        label, a tenant's rule by its scope only, so a tenant's 2,000 rule names cannot become
        2,000 series in every process."""
        return self.label if self.tenant_id is None else f"tenant:{self.scope}"

    def to_rule(self, *, rate_factor: float = 1.0, elastic_pool: ElasticPool | None = None) -> Rule:
        """The limiter rule (see module docstring); ``rate_factor`` < 1 slows the rate (adaptive
        provider pacing) without changing the burst. An elastic rule borrows from
        ``elastic_pool``, and is hard without one; other modes ignore it."""
        mode: Literal["hard", "soft", "elastic"] = "hard"
        if self.mode == "soft" or (self.mode == "elastic" and elastic_pool is not None):
            mode = cast(Literal["soft", "elastic"], self.mode)
        pool = elastic_pool if mode == "elastic" else None
        if self.scope == "recipient":
            limit, period_s, burst = 1, self.period_s / rate_factor, self.limit - 1
        else:
            limit, period_s, burst = self.limit, self.period_s / rate_factor, self.burst
        return Rule(
            self.metric_label,
            limit=limit,
            period_s=period_s,
            burst=burst,
            mode=mode,
            overshoot_pct=self.overshoot_pct,
            elastic_pool=pool,
        )


@dataclass(frozen=True)
class Snapshot:
    """The rules and dedupe windows in force at one moment."""

    rules: tuple[RuleSpec, ...] = ()
    dedupe_windows_s: Mapping[str, int] = field(default_factory=dict)
    _by_scope_tenant: Mapping[tuple[str, str | None], tuple[RuleSpec, ...]] = field(default_factory=dict)

    @classmethod
    def build(cls, rules: Sequence[RuleSpec], windows: Mapping[str, int]) -> Snapshot:
        index: dict[tuple[str, str | None], list[RuleSpec]] = defaultdict(list)
        for r in rules:
            index[(r.scope, r.tenant_id)].append(r)
        return cls(tuple(rules), dict(windows), {k: tuple(v) for k, v in index.items()})

    def for_tenant(self, scope: str, tenant_id: str) -> tuple[RuleSpec, ...]:
        """Rules of ``scope`` that apply to ``tenant_id``: global ones first, then its own."""
        return self._by_scope_tenant.get((scope, None), ()) + self._by_scope_tenant.get(
            (scope, tenant_id), ()
        )

    def recipient_rules(self, tenant_id: str, channel: str, category: str) -> list[RuleSpec]:
        """Frequency caps matching a notification (a rule without channel/category matches any)."""
        return [
            r
            for r in self.for_tenant("recipient", tenant_id)
            if r.channel in (None, channel) and r.category in (None, category)
        ]

    def provider_rules(self, tenant_id: str, channel: str, provider: str) -> list[RuleSpec]:
        """Pacing rules for calls to ``provider`` on ``channel`` (unset fields match any)."""
        return [
            r
            for r in self.for_tenant("provider", tenant_id)
            if r.channel in (None, channel) and r.provider in (None, provider)
        ]

    def dedupe_window_s(self, tenant_id: str) -> int | None:
        """The tenant's content-dedupe window in seconds, or None when it has none."""
        return self.dedupe_windows_s.get(tenant_id)


class RulesCache:
    """A `Snapshot` refreshed from the DB when older than ``ttl_s`` (see module docstring)."""

    def __init__(
        self, fetch: Fetch, *, ttl_s: float = REFRESH_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._fetch = fetch
        self.ttl_s = ttl_s
        self._clock = clock
        self._snapshot: Snapshot | None = None
        self._loaded_at = 0.0
        self._lock = asyncio.Lock()

    @classmethod
    def from_pool(cls, pool: asyncpg.Pool, *, ttl_s: float = REFRESH_TTL_S) -> RulesCache:
        async def fetch(sql: str) -> Sequence[Mapping[str, Any]]:
            return cast(Sequence[Mapping[str, Any]], await pool.fetch(sql))

        return cls(fetch, ttl_s=ttl_s)

    async def current(self) -> Snapshot:
        """The snapshot, reloaded first if older than ``ttl_s``. If a reload fails, the previous
        snapshot stays in force (and the reload is tried again after ``ttl_s``); with no previous
        snapshot the error propagates."""
        if self._snapshot is not None and self._clock() - self._loaded_at < self.ttl_s:
            return self._snapshot
        async with self._lock:
            if self._snapshot is not None and self._clock() - self._loaded_at < self.ttl_s:
                return self._snapshot
            try:
                self._snapshot = await self._load()
            except Exception:
                if self._snapshot is None:
                    raise
                log.warning("rate-limit rules not refreshed; keeping the previous ones", exc_info=True)
            self._loaded_at = self._clock()
            return self._snapshot

    async def _load(self) -> Snapshot:
        loaded = [
            RuleSpec(
                id=r["id"],
                tenant_id=r["tenant_id"],
                name=r["name"] or "",
                scope=r["scope"],
                channel=r["channel"],
                category=r["category"],
                provider=r["provider"],
                limit=int(r["limit"]),
                period_s=float(r["period_s"]),
                burst=int(r["burst"]),
                mode=r["mode"],
                overshoot_pct=float(r["overshoot_pct"]),
                action=r["action"],
            )
            for r in await self._fetch(RULES_SQL)
        ]
        rules = [spec for spec in loaded if _enforceable(spec)]
        metrics.RATE_LIMIT_RULES_SKIPPED.set(len(loaded) - len(rules))
        windows = {r["id"]: int(r["content_dedupe_window_s"]) for r in await self._fetch(WINDOWS_SQL)}
        return Snapshot.build(rules, windows)


def _enforceable(spec: RuleSpec) -> bool:
    """A stored rule no limiter can enforce (written before the API checked, or by hand) is left
    out, logged and counted (``clarion_rate_limit_rules_skipped``), so it cannot break the sends
    of every process that loads it. Checked as the limiter will get it (a recipient cap becomes
    one per period with a burst), so ``to_rule`` never raises for a loaded rule."""
    try:
        check_rule_parameters(
            rule_id=str(spec.id), limit=spec.limit, period_s=spec.period_s, burst=spec.burst,
            overshoot_pct=spec.overshoot_pct,
        )  # fmt: skip
        spec.to_rule()
    except InvalidRule as exc:
        log.warning("rate-limit rule skipped: %s", exc)
        return False
    return True
