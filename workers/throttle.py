"""Throttling in the worker: recipient frequency caps and provider pacing, as one `Gate`.

For each notification, right before the provider call:

1. **Provider pacing** (``provider`` rules): every call to a provider account costs its share of
   the rule: one per device or address, an SMS its segment count (`sms_segments`). Priority
   never bypasses pacing. The pace adapts: `AdaptivePacing` slows a provider after it answers
   ``429`` and recovers gradually.
2. **Recipient caps** (``recipient`` rules): one per notification on the key
   ``tenant:user:channel[:category]``; ``priority: critical`` bypasses them. Checked only once
   pacing admitted the call, so a notification held back by pacing never uses up its
   recipient's cap.

An **elastic** recipient cap (``mode: elastic``) is held at its limit only while the provider is
busy: over its own limit, a notification is still sent when the provider pacing it was just
charged to has spare capacity, i.e. would still admit another call right now (under its nominal
limit, at its current adaptive pace). The borrowed send was already paid for by pacing, so
borrowing never lets a provider be called faster than its pacing rules allow. The pool is the
pacing key (rule and provider account) of this notification with the least room left; with no
pacing rule for the notification's channel and provider there is nothing to borrow from, and
the cap is hard. Borrowed sends count as ``decision="borrowed"``.

Over a limit, the rule's action decides: ``delay`` records ``delayed`` with ``not_before`` at the
earliest time the limiter would admit it (later ones for the same key are spread one emission
interval apart, so a backlog is republished a slot at a time, not all at once); ``drop`` records
``throttled`` naming the rule. A notification refused by several rules is dropped if any of them
drops. Each decision is counted in ``clarion_ratelimit_decisions_total{rule, decision}``.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from clarion import metrics
from clarion.rules import RulesCache, RuleSpec
from core.horizon import MAX_WAIT
from core.limiter import build_rate_limiter
from core.ratelimit import Allowed, ElasticPool, InvalidRule, LimitDecision, RateLimiter, RetryAfter, Rule
from core.ratelimit_memory import MemoryRateLimiter
from core.render import RenderedContent
from providers.errors import ProviderError, QuotaExceeded, RecipientThrottled
from providers.registry import NoProviderConfigured, ProviderSet
from schema.enums import Channel, Priority, Status
from workers.claim import ClaimedNotification
from workers.outcome import Outcome
from workers.recipients import Address

# GSM 03.38: the basic set costs one septet, the extension table two (escape + char).
_GSM7_BASIC = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
_GSM7_EXTENDED = frozenset("^{}\\[~]|€\f")


def sms_segments(body: str) -> int:
    """How many segments a carrier bills for ``body``: GSM-7 160 chars in one, 153 per part when
    split; otherwise UCS-2, 70 UTF-16 units in one, 67 per part."""
    if all(c in _GSM7_BASIC or c in _GSM7_EXTENDED for c in body):
        units, single, multi = sum(2 if c in _GSM7_EXTENDED else 1 for c in body), 160, 153
    else:
        # surrogatepass: a lone surrogate counts as the one UTF-16 unit it is, instead of raising
        # (one such body made a whole batch's outcomes be dropped after their provider calls).
        units, single, multi = len(body.encode("utf-16-le", "surrogatepass")) // 2, 70, 67
    return 1 if units <= single else math.ceil(units / multi)


def _paced(spec: RuleSpec, factor: float) -> Rule:
    """``spec``'s limiter rule slowed by ``factor``; at its nominal pace when slowing it would leave
    what a limiter can enforce (the rules loader keeps only rules enforceable at that pace)."""
    try:
        return spec.to_rule(rate_factor=factor)
    except InvalidRule:
        return spec.to_rule()


def provider_names(providers: ProviderSet, channel: Channel) -> Callable[[str | None], str | None]:
    """The provider a message to ``platform`` on ``channel`` goes through (None: no provider would
    take it), asked of the worker's own ``ProviderSet``: the routing table has one home."""

    def name_for(platform: str | None) -> str | None:
        try:
            return providers.for_message(channel, platform).name
        except NoProviderConfigured:
            return None

    return name_for


Check = tuple[RuleSpec, str, Rule, int]
"""One limiter request of the gate: the rule it enforces, its key, the limiter rule, the cost."""

_process_limiter: MemoryRateLimiter | None = None


def shared_rate_limiter(redis_url: str | None, *, key_prefix: str = "clarion:") -> RateLimiter:
    """The worker's limiter: on Redis (shared by every process) when ``redis_url`` is set, else
    one in-process limiter shared by every worker of this process (``clarion dev``), so a
    provider account serving several channels is paced as one."""
    global _process_limiter
    if redis_url is not None:
        return build_rate_limiter(redis_url, prefix=f"{key_prefix}rl:")
    if _process_limiter is None:
        _process_limiter = MemoryRateLimiter()
    return _process_limiter


@dataclass(kw_only=True, eq=False)
class AdaptivePacing:
    """A per-provider rate factor in ``[min_factor, 1]`` applied to its pacing rules.

    A provider ``429`` halves the factor (at most once per ``cooldown_s``, so one burst of
    rejections counts once); every ``quiet_interval_s`` without a 429 adds ``step`` back, up to 1.
    Each process adapts to what its own calls see.
    """

    decrease: float = 0.5
    step: float = 0.1
    quiet_interval_s: float = 5.0
    cooldown_s: float = 1.0
    min_factor: float = 1 / 16
    clock: Callable[[], float] = time.monotonic
    # provider -> (factor at last 429, its time)
    _state: dict[str, tuple[float, float]] = field(default_factory=dict, init=False)

    def factor(self, provider: str) -> float:
        """The current rate factor for ``provider`` (1.0: the rules' nominal pace)."""
        state = self._state.get(provider)
        if state is None:
            return 1.0
        base, at = state
        recovered = base + self.step * math.floor((self.clock() - at) / self.quiet_interval_s)
        if recovered >= 1.0:
            del self._state[provider]
            return 1.0
        return recovered

    def on_provider_error(self, error: ProviderError) -> None:
        """Slow the provider down when it answered 429 (the pipeline's ``on_provider_error`` hook);
        not for a 429 about one recipient (``RecipientThrottled``), nor one of a quota the provider
        does not say is whose (``QuotaExceeded``: the sending tenant's breaker takes it)."""
        if error.http_status != 429 or isinstance(error, RecipientThrottled | QuotaExceeded):
            return
        now = self.clock()
        state = self._state.get(error.provider)
        if state is not None and now - state[1] < self.cooldown_s:
            return
        factor = max(self.min_factor, self.factor(error.provider) * self.decrease)
        self._state[error.provider] = (factor, now)
        metrics.PACING_FACTOR.labels(error.provider).set(factor)


class ThrottleGate:
    """Enforces recipient caps and provider pacing (see module docstring)."""

    name = "throttle"

    def __init__(
        self,
        *,
        rules: RulesCache,
        limiter: RateLimiter,
        provider_name: Callable[[str | None], str | None],
        pacing: AdaptivePacing | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.rules = rules
        self.limiter = limiter
        self.provider_name = provider_name
        self.pacing = pacing or AdaptivePacing()
        self._clock = clock
        self._next_slot: dict[str, datetime] = {}  # key -> latest not_before handed out for it

    async def admit(
        self, row: ClaimedNotification, content: RenderedContent, addresses: list[Address]
    ) -> Outcome | None:
        """None to send now; else ``delayed`` (with ``not_before``) or ``throttled``."""
        snapshot = await self.rules.current()
        tenant, channel = row.tenant_id, row.channel
        costs: dict[str, int] = defaultdict(int)
        for address in addresses:
            name = self.provider_name(address.platform)
            if name is not None:
                costs[name] += sms_segments(content.body) if channel == Channel.sms.value else 1
        pacing = [
            (spec, f"provider:{spec.id}:{name}", _paced(spec, self.pacing.factor(name)), cost)
            for name, cost in costs.items()
            for spec in snapshot.provider_rules(tenant, channel, name)
        ]
        paced = await self._acquire(pacing)
        stop = self._verdict(row, pacing, paced)
        if stop is not None or row.priority == Priority.critical.value:
            return stop
        pool = _spare_capacity_pool(pacing, paced)
        caps = [
            (spec, _recipient_key(spec, row), spec.to_rule(elastic_pool=pool), 1)
            for spec in snapshot.recipient_rules(tenant, channel, row.category)
        ]
        return self._verdict(row, caps, await self._acquire(caps))

    async def _acquire(self, checks: list[Check]) -> list[LimitDecision]:
        if not checks:
            return []
        return await self.limiter.acquire_many(
            [(key, rule, min(cost, rule.capacity)) for _, key, rule, cost in checks]
        )

    def _verdict(
        self, row: ClaimedNotification, checks: list[Check], decisions: list[LimitDecision]
    ) -> Outcome | None:
        refused = [
            (spec, key, rule, d)
            for (spec, key, rule, _), d in zip(checks, decisions, strict=True)
            if isinstance(d, RetryAfter)
        ]
        refused_ids = {id(r[0]) for r in refused}
        for (spec, _, rule, _), d in zip(checks, decisions, strict=True):
            if id(spec) not in refused_ids:
                borrowed = rule.mode == "elastic" and isinstance(d, Allowed) and d.over_limit
                metrics.RATELIMIT_DECISIONS.labels(
                    spec.metric_label, "borrowed" if borrowed else "allowed"
                ).inc()
        if not refused:
            return None
        dropping = [r for r in refused if r[0].action == "drop"]
        not_before: datetime | None = None
        if not dropping:
            slots = {key: self._slot(key, rule, d) for _, key, rule, d in refused}
            # Past the horizon (core/horizon.py: its day of the log would stay) it is not held, and
            # a notification not held takes no slot from the ones behind it.
            if max(slots.values()) <= self._clock() + MAX_WAIT:
                not_before = max(slots.values())
                self._reserve(slots)
        for spec, _, _, _ in refused:
            decision = "delayed" if not_before is not None else "dropped"
            metrics.RATELIMIT_DECISIONS.labels(spec.metric_label, decision).inc()
        if dropping:
            spec = dropping[0][0]
            return Outcome(
                notification_id=row.id,
                status=Status.throttled,
                error_code="rate_limited",
                error_message=f"dropped by {spec.scope} rule '{spec.label}' ({spec.limit} per {spec.period_s:g}s)",
                detail=f"rule {spec.label}",
            )
        spec = max(refused, key=lambda r: r[3].retry_after_ms)[0]
        if not_before is None:
            return Outcome(
                notification_id=row.id,
                status=Status.throttled,
                error_code="rate_limited",
                error_message=(
                    f"held by {spec.scope} rule '{spec.label}' ({spec.limit} per {spec.period_s:g}s) "
                    f"past {MAX_WAIT.days} days: not sent"
                ),
                detail=f"rule {spec.label}",
            )
        return Outcome(
            notification_id=row.id,
            status=Status.delayed,
            error_code="rate_limited",
            error_message=f"held by {spec.scope} rule '{spec.label}' ({spec.limit} per {spec.period_s:g}s)",
            not_before=not_before,
            detail=f"rule {spec.label}",
        )

    def _slot(self, key: str, rule: Rule, refusal: RetryAfter) -> datetime:
        """When a notification held on ``key`` may go: after the limiter's wait and one emission
        interval after the slot of the last one held there (not yet taken: ``_reserve``)."""
        now = self._clock()
        due = now + timedelta(milliseconds=refusal.retry_after_ms)
        previous = self._next_slot.get(key)
        if previous is not None and previous >= now:
            due = max(due, previous + timedelta(seconds=rule.period_s / rule.limit))
        return due

    def _reserve(self, slots: dict[str, datetime]) -> None:
        now = self._clock()
        if len(self._next_slot) > 10_000:
            self._next_slot = {k: v for k, v in self._next_slot.items() if v >= now}
        self._next_slot.update(slots)


def _spare_capacity_pool(pacing: list[Check], decisions: list[LimitDecision]) -> ElasticPool | None:
    """The pacing key (all admitted this call) with the least room left, read-only: its owner,
    the pacing check, has already charged it for this notification."""
    admitted = [
        (d.remaining, key, rule)
        for (_, key, rule, _), d in zip(pacing, decisions, strict=True)
        if isinstance(d, Allowed)
    ]
    if not admitted:
        return None
    _, key, rule = min(admitted, key=lambda a: a[0])
    return ElasticPool(key, rule, read_only=True)


def _recipient_key(spec: RuleSpec, row: ClaimedNotification) -> str:
    key = f"recipient:{spec.id}:{row.tenant_id}:{row.user_id}:{row.channel}"
    return key + f":{row.category}" if spec.category else key
