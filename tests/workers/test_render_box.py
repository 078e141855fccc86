"""The render box: renders of a tenant owing render CPU run in a child process, not on the API's
GIL, with the same answers and limits as in-process renders."""

from __future__ import annotations

import asyncio
import os

import pytest

from clarion.settings import Settings
from core.render import OWING_S, THREAD_SLICE_MS, Renderer, RequestBudget
from core.render_box import RenderBox
from core.render_errors import RenderError, TurnNotReady
from harness.services import ApiServer, wait_until
from tests.fixtures.hostile_templates import HOSTILE
from tests.fixtures.render_turn import turn_held

SLOW = HOSTILE["nested_range_loop"]


def box_pid(renderer: Renderer) -> int | None:
    child = renderer._box._child
    return child.pid if child is not None and child.returncode is None else None


async def test_a_tenant_owing_render_cpu_renders_in_the_box_and_others_stay_in_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No paying back: on a loaded machine the box's render at nice 19 may take long enough for the
    # tenant to have paid its debt by the time it is looked at (the share is per second of wall time).
    monkeypatch.setattr("core.render.RENDER_CPU_SHARE", 0.0)
    renderer = Renderer(max_render_ms=100)
    try:
        assert not renderer.owes("b")
        with pytest.raises(RenderError):
            await renderer.render_async(subject=None, body=SLOW, html=None, data={}, tenant="b")
        assert renderer.owes("b"), f"a refused 100 ms render leaves more than {OWING_S} s owed"
        assert renderer._box.renders == 1, f"a render past {THREAD_SLICE_MS} ms finishes in the box"

        owed = renderer._debts["b"].settle()
        content = await renderer.render_async(
            subject="Hi {{ name }}", body="{{ n * 2 }}", html="<b>{{ name }}</b>", data={"name": "<x>", "n": 21},
            tenant="b",
        )  # fmt: skip
        assert (content.subject, content.body, content.html) == ("Hi <x>", "42", "<b>&lt;x&gt;</b>")
        assert renderer._box.renders == 2, "a tenant owing render CPU renders in the box at once"
        assert box_pid(renderer) is not None
        with pytest.raises(RenderError) as caught:
            await renderer.render_async(subject=None, body="{{ missing }}", html=None, data={}, tenant="b")
        assert (caught.value.code, caught.value.variable) == ("missing_variable", "missing")
        assert renderer._debts["b"].debt_s >= owed - 1.0, "box renders are charged to the tenant"

        # The worker renders what was accepted (cpu_share=False): never in the box, never refused.
        box = renderer._box._child
        assert (
            await renderer.render_async(
                subject=None, body="x", html=None, data={}, tenant="b", cpu_share=False
            )
        ).body == "x"
        assert renderer._box._child is box
        assert (
            await renderer.render_async(subject=None, body="fine", html=None, data={}, tenant="a")
        ).body == "fine"
    finally:
        await renderer.aclose()


async def test_ordinary_renders_stay_on_the_render_threads() -> None:
    renderer = Renderer(max_render_ms=100)
    try:
        for n in range(50):
            content = await renderer.render_async(
                subject="Hi {{ name }}", body="{{ n * 2 }}", html=None, data={"name": "x", "n": n}, tenant="a"
            )
            assert content.body == str(n * 2)
        assert renderer._box.renders == 0 and box_pid(renderer) is None
        assert not renderer.owes("a")
    finally:
        await renderer.aclose()


async def test_the_box_keeps_the_limits_and_charges_a_shared_request_budget() -> None:
    renderer, box = Renderer(max_render_ms=100), RenderBox()
    budget = RequestBudget(150)
    try:
        with pytest.raises(RenderError) as caught:
            await box.render(renderer, subject=None, body=SLOW, html=None, data={}, budget=budget)
        assert caught.value.code == "render_limit" and caught.value.cpu_s >= 0.09
        assert budget.remaining_ms <= 60
        for bomb in ("power_squaring", "repr_output", "plus_chain", "sum_lists"):
            with pytest.raises(RenderError) as caught:
                await box.render(renderer, subject=None, body=HOSTILE[bomb], html=None, data={}, budget=None)
            assert caught.value.code == "render_limit", bomb
    finally:
        await box.aclose()


async def test_a_box_that_died_is_replaced_and_only_the_render_in_flight_is_refused() -> None:
    renderer, box = Renderer(max_render_ms=1000), RenderBox()
    try:
        await box.render(renderer, subject=None, body="a", html=None, data={}, budget=None)
        first = box._child
        assert first is not None
        in_flight = asyncio.ensure_future(
            box.render(renderer, subject=None, body=SLOW, html=None, data={}, budget=None)
        )
        await wait_until(lambda: box._lock.locked())
        first.kill()
        with pytest.raises(RenderError) as caught:
            await in_flight
        assert (caught.value.code, caught.value.message) == (
            "render_limit",
            "template stopped its render process",
        )
        content, _ = await box.render(
            renderer, subject=None, body="b {{ x }}", html=None, data={"x": 1}, budget=None
        )
        assert content.body == "b 1"
        assert box._child is not None and box._child.pid != first.pid
    finally:
        await box.aclose()


async def test_a_batch_holds_its_tenants_render_turn_for_all_its_items() -> None:
    renderer = Renderer()
    order: list[str] = []
    go = asyncio.Event()

    async def batch() -> None:
        async with renderer.turns.turn("b"):
            await go.wait()
            for i in range(3):
                await renderer.render_async(subject=None, body=f"item{i}", html=None, data={}, tenant="b")
                order.append(f"item{i}")
                await asyncio.sleep(0)  # a chance for the tenant's other request to cut in

    async def single() -> None:
        await renderer.render_async(subject=None, body="single", html=None, data={}, tenant="b")
        order.append("single")

    held = asyncio.ensure_future(batch())
    await wait_until(lambda: "b" in renderer.turns._turns)
    waiting = asyncio.ensure_future(single())
    await wait_until(lambda: renderer.turns._turns["b"].waiting == 2)  # the single request queues
    go.set()
    await asyncio.gather(held, waiting)
    assert order == ["item0", "item1", "item2", "single"]
    assert renderer.turns._turns == {}


async def test_the_api_starts_its_render_box_with_itself_and_stops_it_with_itself(settings: Settings) -> None:
    api = ApiServer(settings.model_copy(update={"render_box_at_start": True}))
    await api.start()
    try:
        renderer = api.app.state.renderer
        pid = box_pid(renderer)
        assert pid is not None, "started with the API, before any render"
    finally:
        await api.stop()
    assert box_pid(renderer) is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_a_turn_not_come_within_its_wait_raises_turn_not_ready_which_is_no_render_error() -> None:
    """Every ``except RenderError`` fails a send or refuses content: a render that only has to wait
    for its turn must not be taken for one that does not render."""
    renderer = Renderer()
    async with turn_held(renderer, "b") as release:
        with pytest.raises(TurnNotReady) as caught:
            async with renderer.turns.turn("b", wait_s=0.05):
                pytest.fail("entered a turn another task holds")
        assert not isinstance(caught.value, RenderError)
        assert (caught.value.tenant, caught.value.wait_s) == ("b", 0.05)
        assert renderer.turns._turns["b"].waiting == 1, "the one that gave up waits no more"
        release.set()
    async with renderer.turns.turn("b", wait_s=0.05):
        pass  # free again: given up on, the wait took nothing
    assert renderer.turns._turns == {}


async def test_at_accept_a_render_waiting_too_long_for_its_tenants_turn_is_refused_a_worker_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("core.render_turns.TURN_WAIT_S", 0.2)
    renderer = Renderer()
    try:
        async with turn_held(renderer, "b") as release:
            with pytest.raises(RenderError) as caught:
                await renderer.render_async(subject=None, body="x", html=None, data={}, tenant="b")
            assert caught.value.code == "render_limit" and "still rendering" in str(caught.value)
            worker_render = asyncio.create_task(
                renderer.render_async(subject=None, body="x", html=None, data={}, tenant="b", cpu_share=False)
            )
            done, _ = await asyncio.wait({worker_render}, timeout=0.5)  # past TURN_WAIT_S: still waiting
            assert not done, "the worker waits for the turn: a refusal there would fail a send"
            release.set()
            assert (await worker_render).body == "x"
    finally:
        await renderer.aclose()


async def test_a_request_budget_past_its_deadline_refuses_the_render() -> None:
    renderer = Renderer()
    try:
        with pytest.raises(RenderError) as caught:
            await renderer.render_async(
                subject=None, body="x", html=None, data={}, tenant="b", budget=RequestBudget(1_000, wall_s=0)
            )
        assert caught.value.code == "render_limit"
        fine = RequestBudget(1_000, wall_s=60)
        assert 0 < fine.remaining_ms <= 1_000
        assert (
            await renderer.render_async(subject=None, body="x", html=None, data={}, tenant="b", budget=fine)
        ).body == "x"
    finally:
        await renderer.aclose()


async def test_cheap_sources_render_on_the_loop_until_their_data_makes_them_slow() -> None:
    renderer = Renderer(max_render_ms=100)
    body = "{% for i in range(n) %}{% for j in range(n) %}{% endfor %}x{% endfor %}"
    key = (None, body, None)
    try:
        for _ in range(10):  # the first also compiles the template; a thread's first render costs more
            content = await renderer.render_async(
                subject=None, body=body, html=None, data={"n": 3}, cpu_share=False
            )
            assert content.body == "xxx"
            if renderer._cheap.get(key):
                break
        assert renderer._cheap[key] is True  # the next render of these sources runs on the loop
        with pytest.raises(RenderError) as caught:  # past INLINE_MS on the loop, past the limit on a thread
            await renderer.render_async(
                subject=None, body=body, html=None, data={"n": 100_000}, cpu_share=False
            )
        assert caught.value.code == "render_limit"
        assert renderer._cheap[key] is False
    finally:
        await renderer.aclose()


def test_ids_are_unique_across_threads() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from schema.ids import uuid7

    with ThreadPoolExecutor(8) as pool:
        ids = [i for batch in pool.map(lambda _: [uuid7() for _ in range(2_000)], range(8)) for i in batch]
    assert len(set(ids)) == len(ids) == 16_000
