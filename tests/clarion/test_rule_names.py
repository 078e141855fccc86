"""A rule stored before names were checked (any 128 characters) still loads and is still enforced,
by the API, the relay and every worker alike; wherever its name would be shown it is called by its
id instead, so an escape sequence or a bidi override stored then goes nowhere."""

from __future__ import annotations

import pytest

from clarion.rules import RulesCache
from schema.enums import Status
from tests.fixtures.throttle_gate import Table, admit_n, gate_for, rule_row

STORED_NAMES = [
    "\x1b]52;c;aGk=\x07",
    "cap\u202egnp.exe",
    "cap\nheld by tenant rule 'x'",
    "cap\x9b2J",
    "tenant:t-1",
    "two words",
    "x" * 128,
]


@pytest.mark.parametrize("name", STORED_NAMES, ids=ascii)
async def test_a_stored_rule_with_an_unsafe_name_is_loaded_and_called_by_its_id(name: str) -> None:
    tenants, operators = rule_row(name=name), rule_row(name=name, tenant_id=None, scope="provider")
    snapshot = await RulesCache(Table([tenants, operators]).fetch).current()
    assert [r.id for r in snapshot.rules] == [tenants["id"], operators["id"]]  # none skipped
    mine, global_ = snapshot.rules
    assert mine.label == str(tenants["id"]) and mine.metric_label == "tenant:recipient"
    assert global_.label == global_.metric_label == str(operators["id"])  # a bounded, inert label


@pytest.mark.parametrize("name", STORED_NAMES, ids=ascii)
async def test_a_send_held_or_dropped_by_such_a_rule_names_its_id(name: str) -> None:
    dropping = rule_row(name=name, limit=1, action="drop")
    delaying = rule_row(name=name, limit=1, action="delay")
    for row in (dropping, delaying):
        first, second = await admit_n(gate_for(row), 2)
        assert first is None
        assert second.status in (Status.throttled, Status.delayed)
        assert second.detail == f"rule {row['id']}"
        assert f"rule '{row['id']}'" in second.error_message and name not in second.error_message
