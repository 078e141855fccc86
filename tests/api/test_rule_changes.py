"""A change to a tenant's ``tenant`` rules reaches its parked scheduled sends (api/rule_changes.py),
at most once every HOLD_AHEAD, and an operator's rule reaches every tenant's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from api.release_pacing import HOLD_AHEAD, ReleasePacing
from api.rule_changes import Relook, RuleChanges
from clarion.rules import RulesCache
from core.ratelimit_memory import MemoryRateLimiter
from tests.api.test_release_pacing import due, tenant_rule
from tests.fixtures.throttle_gate import NOW, Table, rule_row


class Rules:
    """A rules table and the changes seen through a cache that reloads on every look."""

    def __init__(self, *rules: dict[str, Any]) -> None:
        self.table = Table(list(rules))
        self.cache = RulesCache(self.table.fetch, ttl_s=0.0)
        self.clock = [NOW]
        self.changes = RuleChanges(every=HOLD_AHEAD, clock=lambda: self.clock[0])

    async def due(self) -> Relook | None:
        return self.changes.due(await self.cache.current())


async def test_the_first_snapshot_is_the_baseline_and_no_change_looks_at_nothing() -> None:
    rules = Rules(tenant_rule())
    assert await rules.due() is None
    assert await rules.due() is None


async def test_a_tenants_changed_rule_looks_at_its_rows_only() -> None:
    rules = Rules(tenant_rule(tenant_id="t1"), tenant_rule(tenant_id="t2", name="other"))
    await rules.due()
    rules.table.rules[0]["limit"] = 100
    assert await rules.due() == Relook(frozenset({"t1"}), everyone=False)


async def test_an_operators_rule_added_or_deleted_looks_at_every_tenant() -> None:
    operator = tenant_rule(tenant_id=None, name="operator")
    rules = Rules(tenant_rule())
    await rules.due()
    rules.table.rules.append(operator)
    relook = await rules.due()
    assert relook is not None and relook.everyone and relook.covers("anyone")
    rules.clock[0] += HOLD_AHEAD
    rules.table.rules.remove(operator)
    assert (await rules.due()) == Relook(frozenset(), everyone=True)


async def test_other_scopes_change_nothing() -> None:
    rules = Rules(tenant_rule())
    await rules.due()
    rules.table.rules.append(rule_row(scope="recipient", name="cap"))
    assert await rules.due() is None


async def test_changes_within_hold_ahead_of_a_look_wait_for_it_and_none_is_lost() -> None:
    """A tenant editing its rule every 2 s costs its held rows one update per HOLD_AHEAD."""
    rules = Rules(tenant_rule(tenant_id="t1"), tenant_rule(tenant_id="t2", name="other"))
    await rules.due()
    rules.table.rules[0]["limit"] = 11
    assert await rules.due() == Relook(frozenset({"t1"}), everyone=False)
    for limit in (12, 13, 14):
        rules.clock[0] += timedelta(seconds=2)
        rules.table.rules[0]["limit"] = limit
        assert await rules.due() is None
    rules.table.rules[1]["limit"] = 50
    assert await rules.due() is None
    rules.clock[0] = NOW + HOLD_AHEAD
    assert await rules.due() == Relook(frozenset({"t1", "t2"}), everyone=False)
    assert await rules.due() is None


async def test_a_relook_starts_the_tenants_queue_again() -> None:
    """The rows moved back are queued under the new rule from now, not after the old turns."""
    table = Table([tenant_rule(limit=1, period_s=60.0)])
    paced = ReleasePacing(
        RulesCache(table.fetch, ttl_s=0.0), MemoryRateLimiter(clock=lambda: 1_000.0), clock=lambda: NOW
    )
    assert await paced.relook() is None
    first = await paced.plan(due(n=10))
    assert first.hold[-1].slot_s == 540.0
    table.rules[0]["limit"] = 60  # one a second
    assert await paced.relook() == Relook(frozenset({"t1"}), everyone=False)
    again = await paced.plan(due(n=3))  # the bucket is still spent: the next turns are a second apart
    assert [h.slot_s for h in again.hold] == [1.0, 2.0, 3.0]
