"""``core.preferences``: the resolution order of :func:`decide`, case by case, and what
``record_opt_outs`` (a provider's STOP, bounce or spam report) leaves in the real database."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest

from core.preferences import CategoryRule, PreferenceDecision, decide, record_opt_outs, wanted
from tests.fixtures.db import rolled_back

REQUIRED = CategoryRule(required=True)
OPT_IN_ONLY = CategoryRule(default_opted_in=False)
# Every level of preference at once, each the opposite of the level below it: whichever level
# decides shows in the answer, so a wrong order cannot give the right one.
EVERY_LEVEL = {("sms", "orders"): True, ("*", "orders"): False, ("sms", "*"): True, ("*", "*"): False}


@dataclass(frozen=True)
class Case:
    name: str
    prefs: dict[tuple[str, str], bool]
    rule: CategoryRule | None
    expected: PreferenceDecision


CASES = [
    Case(
        "a required category ignores every opt-out",
        {("sms", "orders"): False, ("*", "orders"): False, ("sms", "*"): False, ("*", "*"): False},
        REQUIRED,
        PreferenceDecision(True, "category 'orders' is required"),
    ),
    Case(
        "a required category ignores an opt-in-only default",
        {},
        CategoryRule(default_opted_in=False, required=True),
        PreferenceDecision(True, "category 'orders' is required"),
    ),
    Case(
        "channel and category opt-out",
        {("sms", "orders"): False},
        None,
        PreferenceDecision(False, "preference channel=sms category=orders"),
    ),
    Case(
        "channel and category outrank every broader level",
        EVERY_LEVEL,
        None,
        PreferenceDecision(True, "preference channel=sms category=orders"),
    ),
    Case(
        "channel and category opt-in outrank a channel-wide STOP",
        {("sms", "orders"): True, ("sms", "*"): False},
        None,
        PreferenceDecision(True, "preference channel=sms category=orders"),
    ),
    Case(
        "category opt-out on every channel",
        {("*", "orders"): False},
        None,
        PreferenceDecision(False, "preference category=orders"),
    ),
    Case(
        "category on every channel outranks channel and everything",
        {k: v for k, v in EVERY_LEVEL.items() if k != ("sms", "orders")},
        None,
        PreferenceDecision(False, "preference category=orders"),
    ),
    Case(
        "channel-wide opt-out, as the Twilio webhook records a STOP",
        {("sms", "*"): False},
        None,
        PreferenceDecision(False, "preference channel=sms"),
    ),
    Case(
        "channel-wide opt-out beats an opted-in category default",
        {("sms", "*"): False},
        CategoryRule(default_opted_in=True),
        PreferenceDecision(False, "preference channel=sms"),
    ),
    Case(
        "channel-wide outranks everything",
        {("sms", "*"): True, ("*", "*"): False},
        OPT_IN_ONLY,
        PreferenceDecision(True, "preference channel=sms"),
    ),
    Case(
        "opt-out of everything",
        {("*", "*"): False},
        None,
        PreferenceDecision(False, "preference all channels and categories"),
    ),
    Case(
        "opt-in to everything beats an opt-in-only default",
        {("*", "*"): True},
        OPT_IN_ONLY,
        PreferenceDecision(True, "preference all channels and categories"),
    ),
    Case(
        "another channel's or category's opt-outs do not apply",
        {("email", "orders"): False, ("*", "promos"): False, ("push", "*"): False, ("email", "*"): False},
        None,
        PreferenceDecision(True, "category 'orders' default (opted in)"),
    ),
    Case(
        "declared opt-in-only category, no preference",
        {},
        OPT_IN_ONLY,
        PreferenceDecision(False, "category 'orders' default (opted out)"),
    ),
    Case(
        "declared category opted in by default, no preference",
        {},
        CategoryRule(default_opted_in=True),
        PreferenceDecision(True, "category 'orders' default (opted in)"),
    ),
    Case(
        "undeclared category, no preference",
        {},
        None,
        PreferenceDecision(True, "category 'orders' default (opted in)"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_decide_resolves_most_specific_first(case: Case) -> None:
    assert decide(prefs=case.prefs, channel="sms", category="orders", rule=case.rule) == case.expected


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_wanted_answers_as_decide_does(case: Case) -> None:
    """The preference page's shortcut (no source named) gives the answer :func:`decide` gives."""
    assert (
        wanted(prefs=case.prefs, channel="sms", category="orders", rule=case.rule) is case.expected.opted_in
    )


# record_opt_outs, against the real schema; each test's rows are rolled back with its transaction.


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection in a transaction rolled back after the test, with a tenant of its own."""
    async with rolled_back(database_url, tenant_id="t-prefs") as connection:
        yield connection


async def new_user(conn: asyncpg.Connection, prefs: dict[tuple[str, str], bool]) -> uuid.UUID:
    user_id = uuid.uuid4()
    await conn.execute(
        "INSERT INTO users (id, tenant_id, external_id) VALUES ($1, 't-prefs', $2)", user_id, str(user_id)
    )
    await conn.executemany(
        "INSERT INTO preferences (user_id, channel, category, opted_in) VALUES ($1, $2, $3, $4)",
        [(user_id, channel, category, opted_in) for (channel, category), opted_in in prefs.items()],
    )
    return user_id


async def stored(conn: asyncpg.Connection, user_id: uuid.UUID) -> dict[tuple[str, str], bool]:
    rows = await conn.fetch("SELECT channel, category, opted_in FROM preferences WHERE user_id = $1", user_id)
    return {(r["channel"], r["category"]): r["opted_in"] for r in rows}


async def test_a_channel_wide_stop_closes_every_category_opted_into_on_that_channel(
    conn: asyncpg.Connection,
) -> None:
    before = {
        ("sms", "orders"): True,
        ("*", "promos"): True,
        ("sms", "alerts"): False,
        ("email", "news"): True,
        ("*", "*"): True,
    }
    user = await new_user(conn, before)
    bystander = await new_user(conn, {("sms", "orders"): True, ("sms", "bystanders-only"): True})

    await record_opt_outs(conn=conn, opt_outs=[(user, "sms", "*")])

    after = await stored(conn, user)
    assert after == {
        **before,
        ("sms", "*"): False,
        ("sms", "orders"): False,
        ("sms", "promos"): False,
        ("sms", "alerts"): False,
    }
    for category in ("orders", "promos", "alerts", "never-set"):
        assert not decide(prefs=after, channel="sms", category=category, rule=None).opted_in, category
    assert decide(prefs=after, channel="email", category="news", rule=None).opted_in
    assert await stored(conn, bystander) == {("sms", "orders"): True, ("sms", "bystanders-only"): True}


async def test_an_opt_out_of_one_category_touches_only_that_category(conn: asyncpg.Connection) -> None:
    user = await new_user(conn, {("email", "news"): True, ("email", "orders"): True, ("*", "*"): True})

    await record_opt_outs(conn=conn, opt_outs=[(user, "email", "news"), (user, "email", "digest")])

    assert await stored(conn, user) == {
        ("email", "news"): False,
        ("email", "digest"): False,
        ("email", "orders"): True,
        ("*", "*"): True,
    }


async def test_recording_the_same_opt_out_twice_is_harmless_and_nothing_is_a_no_op(
    conn: asyncpg.Connection,
) -> None:
    user = await new_user(conn, {("sms", "orders"): True})
    await record_opt_outs(conn=conn, opt_outs=[])
    assert await stored(conn, user) == {("sms", "orders"): True}
    await record_opt_outs(conn=conn, opt_outs=[(user, "sms", "*"), (user, "sms", "*")])
    await record_opt_outs(conn=conn, opt_outs=[(user, "sms", "*")])
    assert await stored(conn, user) == {("sms", "*"): False, ("sms", "orders"): False}
