"""``Renderer.render_now``: a cheap render done at once on the loop, never past anything it would
have waited for in ``render_async`` (the tenant's turn held elsewhere, a CPU debt, a spent budget)."""

from __future__ import annotations

from core.render import OWING_S, Renderer, RequestBudget
from tests.fixtures.render_turn import turn_held

SOURCES = {"subject": None, "body": "hi {{ n }}", "html": None}


async def cheap(renderer: Renderer, tenant: str) -> None:
    """Render ``SOURCES`` through ``render_async`` until they are known to be cheap (the first
    render compiles them)."""
    for _ in range(2):
        await renderer.render_async(**SOURCES, data={"n": 0}, tenant=tenant)
    assert renderer._cheap[tuple(SOURCES.values())]


async def test_known_cheap_sources_render_at_once_without_taking_the_turn() -> None:
    renderer = Renderer()
    assert renderer.render_now(**SOURCES, data={"n": 1}, tenant="a") is None, "not yet known to be cheap"
    await cheap(renderer, "a")
    content = renderer.render_now(**SOURCES, data={"n": 2}, tenant="a")
    assert content is not None and content.body == "hi 2"
    assert renderer.turns._turns == {}


async def test_a_turn_held_by_another_task_is_not_jumped() -> None:
    renderer = Renderer()
    await cheap(renderer, "a")
    async with turn_held(renderer, "a"):
        assert renderer.render_now(**SOURCES, data={"n": 1}, tenant="a") is None
        other = renderer.render_now(**SOURCES, data={"n": 1}, tenant="b")
        assert other is not None, "another tenant's turn is its own"
    async with renderer.turns.turn("a"):  # this task's own turn (a batch) does not stand in the way
        assert renderer.render_now(**SOURCES, data={"n": 1}, tenant="a") is not None


async def test_a_tenant_owing_render_cpu_or_a_spent_budget_goes_the_long_way() -> None:
    renderer = Renderer()
    await cheap(renderer, "a")
    renderer._debts["a"].debt_s = OWING_S * 2
    assert renderer.render_now(**SOURCES, data={"n": 1}, tenant="a") is None
    assert renderer.render_now(**SOURCES, data={"n": 1}, tenant="a", cpu_share=False) is not None
    spent = RequestBudget(total_ms=0)
    assert renderer.render_now(**SOURCES, data={"n": 1}, tenant="b", budget=spent) is None
    await renderer.aclose()
