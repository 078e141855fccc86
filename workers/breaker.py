"""Per-provider circuit breakers: stop calling a provider that is failing, resume when it recovers.

States, per provider name:

- ``closed``: calls go through. Every call's result enters a rolling window of ``window_s``; once
  the window holds at least ``min_calls`` calls and the share of transient failures reaches
  ``failure_rate``, the breaker opens. Permanent errors and invalid recipients are answers from a
  working provider: they count as calls, not as failures.
- ``open``: no call is attempted for ``cool_down_s``. The pipeline reschedules the notification
  (``retrying``, ``not_before`` = the reopen time) without consuming one of its attempts.
- ``half_open``: after the cool-down exactly one probe call goes through; the others wait. The
  probe's success closes the breaker (and clears the window), its failure opens it again.

**A tenant's own breaker.** A quota the provider does not say is whose (``QuotaExceeded``: FCM's
``429 QUOTA_EXCEEDED`` for the project, one device or one topic alike) counts on a breaker of the
sending tenant on that provider: one tenant flooding one of its devices opens its own breaker and
no one else's. Once the refusals are spread over enough tenants and devices to be the provider's
own quota (``workers.quota_spread``), they count on the provider's breaker too, and the sender
slows the provider's pacing (``Breakers.widespread``). The refusals are counted with breakers
disabled too (the pacing still needs to know). A tenant's breaker is dropped at its first call that
leaves it closed with no such refusal in its window; there are at most as many as tenants, and
none is exported as a metric. ``RecipientThrottled`` (one device, named by the provider) counts on
no breaker at all.

Breakers live in the worker process that makes the calls: in a deployment with several worker
processes (or replicas) each has its own breakers, which open and close independently. The state is
exported as ``clarion_breaker_state`` (0 closed, 1 half-open, 2 open) and, for code in the same
process (``clarion dev``, tests), as ``breaker_states()``.
"""

from __future__ import annotations

import random
import time
import weakref
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from clarion import metrics
from clarion.retry_settings import BreakerSettings
from providers.errors import PermanentProviderError, QuotaExceeded, RecipientThrottled
from workers.quota_spread import QuotaSpread

CLOSED, HALF_OPEN, OPEN = "closed", "half_open", "open"
_GAUGE = {CLOSED: 0, HALF_OPEN: 1, OPEN: 2}


class CircuitOpen(Exception):
    """The provider's breaker refused the call; nothing was sent. Try again at ``until``."""

    def __init__(self, provider: str, until: datetime) -> None:
        super().__init__(f"circuit breaker for {provider} is open until {until.isoformat()}")
        self.provider = provider
        self.until = until


class CircuitBreaker:
    """One provider's breaker. Not thread-safe; one event loop uses it."""

    def __init__(
        self,
        provider: str,
        settings: BreakerSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        export: bool = True,
    ) -> None:
        """``export=False`` keeps the state out of ``clarion_breaker_state`` (a webhook endpoint's
        breaker: one series per tenant endpoint would be unbounded)."""
        self.provider = provider
        self.settings = settings
        self._clock = clock
        self._export = export
        self._calls: deque[tuple[float, bool]] = deque()
        self._failures = 0  # failed calls in ``_calls``, kept as calls come and go (O(1) a call)
        self._state = CLOSED
        self._opened_at = 0.0
        self._probing = False
        if export:
            metrics.BREAKER_STATE.labels(provider).set(_GAUGE[CLOSED])

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half_open`` (an open breaker past its cool-down reads half-open)."""
        if self._state == OPEN and self._clock() - self._opened_at >= self.settings.cool_down_s:
            self._set(HALF_OPEN)
        return self._state

    def check(self) -> None:
        """Return when a call may be made now (in half-open: this caller is the probe); else raise
        ``CircuitOpen`` with the time worth trying again."""
        state = self.state
        if state == CLOSED:
            return
        if state == HALF_OPEN and not self._probing:
            self._probing = True
            return
        if state == OPEN:
            wait_s = self.settings.cool_down_s - (self._clock() - self._opened_at)
        else:  # a probe is in flight: look again shortly, spread out
            wait_s = min(self.settings.cool_down_s, 2.0) * random.uniform(0.5, 1.0)
        raise CircuitOpen(self.provider, datetime.now(UTC) + timedelta(seconds=max(wait_s, 0.0)))

    def release(self) -> None:
        """Give back a probe ``check`` granted: the call was not made after all, or its answer was
        no verdict on the provider."""
        self._probing = False

    @property
    def quiet(self) -> bool:
        """Closed, with no failure in its window: it would refuse nothing, and forgets nothing."""
        return self.state == CLOSED and self._failures == 0

    def record(self, *, failed: bool) -> None:
        """Count one finished call; ``failed`` for transient failures only."""
        now = self._clock()
        if self._probing or self._state == HALF_OPEN:
            self._probing = False
            if failed:
                self._open(now)
            else:
                self._forget_calls()
                self._set(CLOSED)
            return
        if self._state == OPEN:
            return  # a call that started before the breaker opened
        self._calls.append((now, failed))
        self._failures += failed
        horizon = now - self.settings.window_s
        while self._calls and self._calls[0][0] < horizon:
            self._failures -= self._calls.popleft()[1]
        if (
            len(self._calls) >= self.settings.min_calls
            and self._failures / len(self._calls) >= self.settings.failure_rate
        ):
            self._open(now)

    def _open(self, now: float) -> None:
        self._opened_at = now
        self._forget_calls()
        self._set(OPEN)

    def _forget_calls(self) -> None:
        self._calls.clear()
        self._failures = 0

    def _set(self, state: str) -> None:
        self._state = state
        if self._export:
            metrics.BREAKER_STATE.labels(self.provider).set(_GAUGE[state])


class Breakers:
    """The breakers of one worker: one per provider name, created on first use, and a tenant's own
    on a provider while it is refused for quotas the provider does not say are whose."""

    def __init__(self, settings: BreakerSettings, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._clock = clock
        self._by_provider: dict[str, CircuitBreaker] = {}
        self._by_tenant: dict[tuple[str, str], CircuitBreaker] = {}
        self._quotas = QuotaSpread(window_s=settings.window_s, clock=clock)
        _BOARDS.add(self)

    def for_provider(self, provider: str) -> CircuitBreaker | None:
        """The provider's breaker, or None when breakers are disabled."""
        if not self.settings.enabled:
            return None
        breaker = self._by_provider.get(provider)
        if breaker is None:
            breaker = self._by_provider[provider] = CircuitBreaker(provider, self.settings, clock=self._clock)
        return breaker

    def check(self, provider: str, tenant: str) -> None:
        """Return when ``tenant`` may call ``provider`` now, else raise ``CircuitOpen``; the
        tenant's own breaker is asked first, so that a probe it grants is given back when the
        provider's refuses (taken first, the provider's probe would never be answered)."""
        shared = self.for_provider(provider)
        if shared is None:
            return
        own = self._by_tenant.get((provider, tenant))
        if own is not None:
            own.check()
        try:
            shared.check()
        except CircuitOpen:
            if own is not None:
                own.release()
            raise

    def record(
        self, provider: str, tenant: str, error: BaseException | None, *, to: str | None = None
    ) -> None:
        """Count one finished call of ``tenant`` to ``provider`` for device ``to``: on the provider's
        breaker, a transient failure that is not about one recipient; a ``QuotaExceeded`` on the
        tenant's own, and on the provider's too once it is ``widespread`` (``to=None``: a device
        never refused before)."""
        quota = isinstance(error, QuotaExceeded)
        widely = quota and self._quotas.refused(provider, tenant=tenant, to=to)
        shared = self.for_provider(provider)
        if shared is None:
            return
        key = (provider, tenant)
        own = self._by_tenant.get(key)
        if quota and own is None:
            own = self._by_tenant[key] = CircuitBreaker(
                provider, self.settings, clock=self._clock, export=False
            )
        if own is not None:
            own.record(failed=quota)
            if own.quiet:
                del self._by_tenant[key]
        if quota and not widely:
            # Not the provider's verdict, so no answer to the probe its breaker may have granted
            # this call: give it back, or the breaker stays half-open with a probe in flight for ever.
            shared.release()
            return
        shared.record(
            failed=error is not None and not isinstance(error, PermanentProviderError | RecipientThrottled)
        )

    def widespread(self, provider: str) -> bool:
        """Whether ``provider``'s unattributed quota refusals are its own (``workers.quota_spread``)."""
        return self._quotas.widespread(provider)

    def tenant_state(self, provider: str, tenant: str) -> str | None:
        """The state of ``tenant``'s own breaker on ``provider``; None while it has none."""
        own = self._by_tenant.get((provider, tenant))
        return None if own is None else own.state

    def snapshot(self) -> dict[str, str]:
        """State per provider this worker has called."""
        return {name: b.state for name, b in self._by_provider.items()}

    def close(self) -> None:
        """Leave ``breaker_states()``: a stopped worker's breakers no longer speak for the process
        (its objects may outlive it: ``Worker.start`` freezes the GC, so a weak reference alone
        kept a stopped worker's half-open breaker in the merged view)."""
        _BOARDS.discard(self)


_BOARDS: weakref.WeakSet[Breakers] = weakref.WeakSet()


def breaker_states() -> dict[str, str]:
    """State per provider across the workers of this process (for ``/v1/ops/queues``).

    When several workers in the process call the same provider, the worst state wins
    (open > half_open > closed). Another process's breakers are not visible here: read the
    ``clarion_breaker_state`` metric of each worker for those.
    """
    merged: dict[str, str] = {}
    for board in list(_BOARDS):
        for name, state in board.snapshot().items():
            if _GAUGE[state] >= _GAUGE.get(merged.get(name, CLOSED), 0):
                merged[name] = state
    return merged
