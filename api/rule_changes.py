"""Which tenants' ``tenant`` rules changed: their held scheduled sends are looked at again.

The relay parks a scheduled send its tenant's budget has no room for until shortly before its
turn (`api.release_pacing`), which may be days ahead under a slow rule. A rule loosened, deleted
or disabled since must reach those rows, and an operator's rule (every tenant's) reaches every
tenant's. So the relay compares each snapshot of the rules with the one before and, for the
tenants whose ``tenant`` rules changed, moves their held rows back to their ``send_at``: the next
passes queue them again, oldest first, under the rules then in force.

Looking again costs an update of each held row of those tenants, so it happens at most once every
``every`` (`api.release_pacing.HOLD_AHEAD`, 5 minutes), for every change since: a tenant editing
its rule every 2 s costs its held rows one update per 5 minutes, no more than the 5-minute look
again of the first version, which every held row paid whether anything changed or not. A rule
change reaches a held row within that time (and the rules cache's 2 s).

A relay's first snapshot is its baseline: rows held under rules changed while no relay ran keep
their places until they come due.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from clarion.rules import Snapshot

Fingerprint = frozenset[tuple[object, ...]]


@dataclass(frozen=True, slots=True)
class Relook:
    """The tenants whose held rows go back to their ``send_at``: ``everyone`` when a rule of the
    operator's (every tenant's) changed."""

    tenants: frozenset[str]
    everyone: bool

    def covers(self, tenant_id: str) -> bool:
        return self.everyone or tenant_id in self.tenants


class RuleChanges:
    """Collects the tenants whose ``tenant`` rules changed; `due` hands them out at most once
    every ``every``."""

    def __init__(self, *, every: timedelta, clock: Callable[[], datetime]) -> None:
        self.every = every
        self._clock = clock
        self._seen: dict[str | None, Fingerprint] | None = None
        self._pending: set[str] = set()
        self._everyone = False
        self._last: datetime | None = None

    def due(self, snapshot: Snapshot) -> Relook | None:
        """Note what changed in ``snapshot`` since the last call; the tenants to look at again
        when there are any and the last look is ``every`` old, else None."""
        prints = _fingerprints(snapshot)
        if self._seen is not None:
            for owner in prints.keys() | self._seen.keys():
                if prints.get(owner) != self._seen.get(owner):
                    if owner is None:
                        self._everyone = True
                    else:
                        self._pending.add(owner)
        self._seen = prints
        now = self._clock()
        if not (self._pending or self._everyone):
            return None
        if self._last is not None and now - self._last < self.every:
            return None
        relook = Relook(frozenset(self._pending), self._everyone)
        self._pending, self._everyone, self._last = set(), False, now
        return relook


def _fingerprints(snapshot: Snapshot) -> dict[str | None, Fingerprint]:
    """Each owner's (None: the operator's) enabled ``tenant`` rules, by what the limiter reads."""
    rules: dict[str | None, set[tuple[object, ...]]] = defaultdict(set)
    for r in snapshot.rules:
        if r.scope == "tenant":
            rules[r.tenant_id].add((r.id, r.limit, r.period_s, r.burst, r.mode, r.overshoot_pct))
    return {owner: frozenset(specs) for owner, specs in rules.items()}
