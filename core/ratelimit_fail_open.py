"""How a limiter on Redis fails open, and the options every such limiter takes (`LimiterOptions`).

While Redis (or one cluster node) is unreachable a limiter admits: each admission is counted in
``clarion_ratelimit_fail_open_total{rule_id}``, the outage is warned about once, and that Redis is
skipped for ``retry_interval_s`` before it is tried again, so the limiter recovers by itself.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import TypedDict, cast

from prometheus_client import REGISTRY, CollectorRegistry, Counter
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.ratelimit import Allowed, LimitDecision, Rule

log = logging.getLogger(__name__)

UNREACHABLE: tuple[type[BaseException], ...] = (RedisConnectionError, RedisTimeoutError, OSError)

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


class FailOpen:
    """Admission while Redis (or one cluster node, named by ``where``) is unreachable: counts every
    admission, warns once per outage, and skips that Redis for ``retry_interval_s``."""

    def __init__(self, *, registry: CollectorRegistry, retry_interval_s: float) -> None:
        self._total = fail_open_counter(registry)
        self._retry_interval_s = retry_interval_s
        self._down_until: dict[str, float] = {}

    def skipping(self, where: str = "") -> bool:
        """Whether ``where`` failed less than ``retry_interval_s`` ago."""
        return time.monotonic() < self._down_until.get(where, 0.0)

    def admit(
        self, rules: list[Rule], exc: BaseException | None = None, where: str = ""
    ) -> list[LimitDecision]:
        """Admit one request per rule; ``exc``: ``where`` just failed, skip it for a while."""
        if exc is not None:
            if where not in self._down_until:
                log.warning("rate limiter: %s unreachable (%r), admitting without limits", _name(where), exc)
            self._down_until[where] = time.monotonic() + self._retry_interval_s
        for rule in rules:
            self._total.labels(rule_id=rule.rule_id).inc()
        return [Allowed(remaining=rule.limit, reset_after_ms=0) for rule in rules]

    def reachable(self, where: str = "") -> None:
        """``where`` answered: end its outage."""
        if self._down_until and self._down_until.pop(where, None) is not None:
            log.warning("rate limiter: %s reachable again, enforcing limits", _name(where))


def _name(where: str) -> str:
    return f"Redis node {where}" if where else "Redis"


class LimiterOptions(TypedDict, total=False):
    """What every Redis-backed limiter's constructor and ``from_url`` take besides its client."""

    prefix: str
    """Key prefix (default ``clarion:rl:``): processes using the same one share their limits."""
    registry: CollectorRegistry
    """Where the fail-open counter is registered (default: the process registry)."""
    retry_interval_s: float
    """How long an unreachable Redis is skipped before it is tried again (default 1 s)."""


class FailingOpenLimiter:
    """The state every Redis-backed limiter keeps: its key prefix, whether it closes its client,
    and its `FailOpen`."""

    def __init__(
        self,
        *,
        owns_client: bool = False,
        prefix: str = "clarion:rl:",
        registry: CollectorRegistry = REGISTRY,
        retry_interval_s: float = 1.0,
    ) -> None:
        self._prefix = prefix
        self._owns_client = owns_client
        self._fail_open = FailOpen(registry=registry, retry_interval_s=retry_interval_s)
