"""The relay's pacing of scheduled sends coming due (api/release_pacing.py): a tenant's ``tenant``
rule decides how many go now, the rest wait a slot apart; nothing else is held."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest

from api.ingress import tenant_key
from api.release_pacing import HOLD_AHEAD, DueRow, ReleasePacing
from clarion.rules import RulesCache
from core.horizon import MAX_WAIT
from core.ratelimit_memory import MemoryRateLimiter
from tests.fixtures.throttle_gate import NOW, Table, rule_row


def due(tenant_id: str = "t1", *, paced: bool = True, n: int = 1, **overrides: Any) -> list[DueRow]:
    rows = []
    for _ in range(n):
        fields: dict[str, Any] = {
            "id": uuid.uuid4(), "created_at": NOW - timedelta(hours=1), "tenant_id": tenant_id,
            "channel": "email", "user_id": uuid.uuid4(), "priority": "normal", "traceparent": None,
            "paced": paced, "due_at": NOW,
        }  # fmt: skip
        rows.append(DueRow(**{**fields, **overrides}))
    return rows


def tenant_rule(**overrides: Any) -> dict[str, Any]:
    return rule_row(**{"scope": "tenant", "limit": 10, "period_s": 1.0, "burst": 0, **overrides})


def pacing(*rules: dict[str, Any], limiter: MemoryRateLimiter | None = None) -> ReleasePacing:
    # The limiter's clock stands still with the pacing's: a loaded machine cannot refill a bucket.
    return ReleasePacing(
        RulesCache(Table(list(rules)).fetch),
        limiter or MemoryRateLimiter(clock=lambda: 1_000.0),
        clock=lambda: NOW,
    )


async def test_without_a_tenant_rule_everything_due_is_released() -> None:
    rows = due(n=3) + due(paced=False) + due("t2", n=2)
    plan = await pacing(rule_row(scope="recipient")).plan(rows)
    assert plan.release == tuple(rows) and not plan.hold and not plan.throttle and not plan.spent


async def test_a_tenants_rule_releases_its_oldest_and_holds_the_rest_a_slot_apart() -> None:
    mine = due(n=25)
    others = due("t2", n=3)
    recovered = due(paced=False, n=2)  # counted when it first entered a lane: never held
    plan = await pacing(tenant_rule()).plan([*mine, *others, *recovered])

    assert set(plan.release) == {*mine[:10], *others, *recovered}
    assert [h.row for h in plan.hold] == mine[10:]
    assert [h.after_s for h in plan.hold] == pytest.approx([0.1 * (j + 1) for j in range(15)])
    assert {h.rule.name for h in plan.hold} == {"rule"} and not plan.throttle


async def test_a_later_pass_queues_its_holds_after_the_slots_already_given() -> None:
    """Before, every pass started its holds at "now": a backlog shared the first pass's slots and
    came due together again and again (a helper's review: 100,000 rows, 2.5 M holds)."""
    pacing_ = pacing(tenant_rule())
    first = await pacing_.plan(due(n=15))
    second = await pacing_.plan(due(n=3))
    assert len(first.release) == 10 and not second.release  # the bucket (10) is spent
    slots = [h.after_s for h in (*first.hold, *second.hold)]
    assert slots == pytest.approx([0.1 * (j + 1) for j in range(8)])
    assert first.spent == second.spent == {"t1"}


async def test_queued_slots_never_pass_hold_ahead() -> None:
    pacing_ = pacing(tenant_rule(limit=1, period_s=120.0))
    await pacing_.plan(due(n=10))  # slots at 2, 4, then 5 minutes for the rest
    later = await pacing_.plan(due(n=1))
    assert [h.after_s for h in later.hold] == [HOLD_AHEAD.total_seconds()]


async def test_what_the_api_charged_the_tenant_leaves_less_for_its_releases() -> None:
    """One budget: the key the API charges its immediate sends to is the one releases draw on."""
    rule = tenant_rule()
    limiter = MemoryRateLimiter(clock=lambda: 1_000.0)
    spec = (await RulesCache(Table([rule]).fetch).current()).rules[0]
    assert await limiter.acquire(tenant_key(spec, "t1"), spec.to_rule(), 7)

    plan = await pacing(rule, limiter=limiter).plan(due(n=5))
    assert len(plan.release) == 3  # what the 7 immediate sends left of 10
    assert plan.hold[0].after_s == pytest.approx(0.1)


async def test_with_the_budget_spent_nothing_goes_and_the_first_waits_for_its_slot() -> None:
    rule = tenant_rule(limit=2, period_s=10.0)  # one every 5 s
    limiter = MemoryRateLimiter(clock=lambda: 1_000.0)
    spec = (await RulesCache(Table([rule]).fetch).current()).rules[0]
    assert await limiter.acquire(tenant_key(spec, "t1"), spec.to_rule(), 2)

    plan = await pacing(rule, limiter=limiter).plan(due(n=3))
    assert not plan.release
    assert [h.after_s for h in plan.hold] == pytest.approx([5, 10, 15])


async def test_a_hold_is_at_most_hold_ahead_away_so_a_rule_changed_later_reaches_it() -> None:
    plan = await pacing(tenant_rule(limit=1, period_s=120.0)).plan(due(n=5))  # one every 2 minutes
    assert len(plan.release) == 1
    ahead = HOLD_AHEAD.total_seconds()
    assert [h.after_s for h in plan.hold] == pytest.approx([120, 240, ahead, ahead])


async def test_a_hold_past_the_horizon_after_send_at_ends_throttled_only_at_its_horizon() -> None:
    rule = tenant_rule(limit=1, period_s=3_600.0)  # one an hour: the 721st is 30 days out
    late = due(due_at=NOW - MAX_WAIT, n=2)  # due a month ago, held ever since
    fresh = due(n=3)  # due now: held at most HOLD_AHEAD, so a rule loosened later still sends them
    plan = await pacing(rule).plan([*late, *fresh])
    assert plan.release == (late[0],)
    assert [h.row for h in plan.throttle] == [late[1]]
    assert [h.row for h in plan.hold] == fresh


async def test_every_tenant_rule_is_charged_so_a_tenants_own_loose_rule_cannot_pass_the_operators() -> None:
    """A first version charged only the rule of the lowest average rate: a tenant's own rule of ten
    million a month (3.7/s, ten million at once) was it, and the operator's 10/s was never asked."""
    operator = tenant_rule(name="operator", tenant_id=None)
    own = tenant_rule(name="own", limit=10_000_000, period_s=2_678_400.0)
    plan = await pacing(operator, own).plan(due(n=50))
    assert len(plan.release) == 10
    assert {h.rule.name for h in plan.hold} == {"operator"}


async def test_a_rule_refusing_part_admits_what_every_rule_has_room_for() -> None:
    tight, loose = tenant_rule(name="tight", limit=4), tenant_rule(name="loose", limit=100)
    limiter = MemoryRateLimiter(clock=lambda: 1_000.0)
    specs = (await RulesCache(Table([tight, loose]).fetch).current()).rules
    tight_spec = next(s for s in specs if s.name == "tight")
    assert await limiter.acquire(tenant_key(tight_spec, "t1"), tight_spec.to_rule(), 1)  # 3 left
    plan = await pacing(tight, loose, limiter=limiter).plan(due(n=20))
    assert len(plan.release) == 3
    assert plan.hold[0].rule.name == "tight" and plan.hold[0].after_s == pytest.approx(0.25)


async def spend(limiter: MemoryRateLimiter, rules: list[dict[str, Any]], name: str, cost: int) -> None:
    """What the tenant's immediate sends took of rule ``name`` at the API."""
    spec = next(s for s in (await RulesCache(Table(rules).fetch).current()).rules if s.name == name)
    assert await limiter.acquire(tenant_key(spec, "t1"), spec.to_rule(), cost)


async def test_a_soft_rule_releases_what_its_nominal_limit_has_room_for() -> None:
    """A refusing soft rule answers no room at all: the first take_many released nothing under it
    while the tenant also sent at once (a second review: 0 of 20,000 in 300 s)."""
    rule = tenant_rule(mode="soft", overshoot_pct=50.0)
    limiter = MemoryRateLimiter(clock=lambda: 1_000.0)
    await spend(limiter, [rule], "rule", 6)
    plan = await pacing(rule, limiter=limiter).plan(due(n=20))
    assert len(plan.release) == 4


async def test_a_rule_with_room_to_spare_does_not_space_the_held_rows() -> None:
    """Operator 10/s and the tenant's own 1,000 a day: they go 0.1 s apart, not 86.4 s (a second
    review: 88 of 2,000 in half an hour)."""
    rules = [
        tenant_rule(name="operator", tenant_id=None),
        tenant_rule(name="own", limit=1_000, period_s=86_400.0),
    ]
    plan = await pacing(*rules).plan(due(n=2_000))
    assert len(plan.release) == 10
    assert [h.after_s for h in plan.hold[:3]] == pytest.approx([0.1, 0.2, 0.3])
    assert [h.rule.name for h in plan.hold[:3]] == ["operator"] * 3
    assert plan.hold[989].after_s == pytest.approx(99.0)  # the own rule's 990 left go at 10/s
    assert plan.hold[999].rule.name == "own"  # then one every 86.4 s: the 1,000th's slot is 864 s
    assert plan.hold[999].after_s == HOLD_AHEAD.total_seconds()  # out: looked at again before


async def test_a_slot_past_the_horizon_is_throttled_at_once_not_moved_for_a_month() -> None:
    """A rule of one a month over banked sends: under a first version each row was moved every 5
    minutes until its horizon (~8,640 updates; a hostile probe)."""
    rows = due(n=3, due_at=NOW - timedelta(days=1))
    plan = await pacing(tenant_rule(limit=1, period_s=2_592_000.0)).plan(rows)
    assert plan.release == (rows[0],)
    assert [h.row for h in plan.throttle] == rows[1:] and not plan.hold  # 30 and 60 days out: past 29


async def test_rows_few_enough_for_a_roomy_rule_wait_only_for_the_spent_one() -> None:
    rules = [
        tenant_rule(name="operator", tenant_id=None),
        tenant_rule(name="own", limit=1_000, period_s=86_400.0),
    ]
    limiter = MemoryRateLimiter(clock=lambda: 1_000.0)
    await spend(limiter, rules, "operator", 10)
    plan = await pacing(*rules, limiter=limiter).plan(due(n=3))
    assert [h.after_s for h in plan.hold] == pytest.approx([0.1, 0.2, 0.3])


async def test_a_pass_that_releases_nothing_charges_no_rule() -> None:
    """Before, the rules that had room kept the charge every relay run: 50 runs ate half of the
    tenant's own daily allowance while nothing went out (a second review)."""
    rules = [
        tenant_rule(name="operator", tenant_id=None),
        tenant_rule(name="own", limit=1_000, period_s=86_400.0),
    ]
    limiter = MemoryRateLimiter(clock=lambda: 1_000.0)
    await spend(limiter, rules, "operator", 10)
    paced = pacing(*rules, limiter=limiter)
    for _ in range(50):  # fifty relay runs while the operator's bucket stays empty
        assert not (await paced.plan(due(n=20))).release
    spec = next(s for s in (await paced.rules.current()).rules if s.name == "own")
    assert await limiter.acquire(tenant_key(spec, "t1"), spec.to_rule(), 1_000)  # all of it is left
