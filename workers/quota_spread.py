"""When a quota the provider does not say is whose is the provider's own: ``QuotaSpread``.

FCM answers ``429 QUOTA_EXCEEDED`` alike for the project's quota, one device's (240 a minute) and
one topic's (``providers.errors.QuotaExceeded``). The worker charges each such refusal to the
sending tenant's own breaker (``workers.breaker``); this module says when the refusals are spread
so wide that they are the provider's quota: ``WIDESPREAD_TENANTS`` tenants refused within the
breaker's window, each on a device no one was refused on within it before. Then they count on the
provider's breaker too and the sender slows the provider's pacing, so a project quota stops every
tenant however little each sends (a review measured 200 tenants, each below the breaker's
``min_calls``, making 1,800 calls a window with no breaker open and the pace unchanged).

A device refused again counts for no tenant: tenants push to the same users' phones, so one tenant
flooding a phone gets every other tenant's pushes to it refused too, and two of them pushing to it
once made three tenants (a review's probe: every tenant's pushes refused, the pace halved). One
tenant cannot pose as several otherwise: operators create tenants. Three tenants each flooding a
phone of their own at once would still slow everyone.

O(1) amortised a refusal; what is kept is bounded by the tenants and devices refused within the
window (devices by the hash of their token: a token may be 2,048 characters).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

WIDESPREAD_TENANTS = 3


class QuotaSpread:
    """The tenants and devices each provider refused for an unattributed quota, within a window."""

    def __init__(self, *, window_s: float, clock: Callable[[], float]) -> None:
        self._window_s = window_s
        self._clock = clock
        # provider -> tenant (or device hash) -> time of its last counted refusal, oldest first
        self._tenants: dict[str, OrderedDict[str, float]] = {}
        self._devices: dict[str, OrderedDict[int, float]] = {}

    def refused(self, provider: str, *, tenant: str, to: str | None) -> bool:
        """Count ``tenant``'s refusal on device ``to`` (None: a device never refused before); True
        when the provider's refusals are now ``widespread``."""
        now = self._clock()
        fresh = True
        if to is not None:
            devices = self._devices.setdefault(provider, OrderedDict())
            _forget_before(devices, now - self._window_s)
            device = hash(to)
            fresh = device not in devices
            devices[device] = now
            devices.move_to_end(device)
        if fresh:
            tenants = self._tenants.setdefault(provider, OrderedDict())
            tenants[tenant] = now
            tenants.move_to_end(tenant)
        return self.widespread(provider)

    def widespread(self, provider: str) -> bool:
        """``WIDESPREAD_TENANTS`` tenants or more refused by ``provider`` within the window."""
        tenants = self._tenants.get(provider)
        if not tenants:
            return False
        _forget_before(tenants, self._clock() - self._window_s)
        return len(tenants) >= WIDESPREAD_TENANTS


def _forget_before(seen: OrderedDict[str, float] | OrderedDict[int, float], horizon: float) -> None:
    """Drop the entries of ``seen`` (ordered by their time: moved to the end when refreshed) older
    than ``horizon``: O(1) amortised, each entry dropped once."""
    while seen and next(iter(seen.values())) < horizon:
        seen.popitem(last=False)
