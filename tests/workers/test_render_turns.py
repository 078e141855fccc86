"""One tenant's slow renders hold only that tenant's notifications, never a whole batch.

The worker renders a tenant's notifications one at a time and records a batch only when its last
notification is done. Before, 53 sends of one tenant with legal templates of ~140 ms, due at once,
held a batch for 22 s (an end-to-end probe, 2026-11-28): another tenant's SMS, sent a second later
into the next batch, took 23 s instead of 0.9 s. Now a notification whose tenant's turn does not
come within ``turn_wait_s`` is ``delayed`` a moment (``render_deferred``) for a later batch."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from core.render import RenderedContent, Renderer
from tests.fixtures.render_turn import turn_held
from tests.workers.test_isolation import build, by_event, row
from workers.content import MAX_DEFER_S, RENDER_PACE_CAP_S, Content, RenderDeferred
from workers.recipients import Address


class HeldRenderer(Renderer):
    """The real renderer, whose renders of tenant ``t-b`` go on only once ``release`` is set:
    while one waits, it holds t-b's turn (the renderer's own, which the worker entered for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.entered = asyncio.Event()  # a render of t-b holds the turn

    async def render_async(self, *, tenant: str | None = None, **kwargs: Any) -> RenderedContent:
        if tenant == "t-b":
            turn = self.turns._turns.get("t-b")
            assert turn is not None and turn.lock.locked(), "a render runs within its tenant's turn"
            self.entered.set()
            await self.release.wait()
        return await super().render_async(tenant=tenant, **kwargs)


class CountingContent(Content):
    """Lets the held render finish once the tenant's two other notifications were deferred."""

    def __init__(self, renderer: HeldRenderer) -> None:
        super().__init__(pool=None, renderer=renderer, turn_wait_s=0.01)  # type: ignore[arg-type]
        self.held = renderer
        self.deferred = 0

    async def render(self, n: Any) -> RenderedContent:
        try:
            return await super().render(n)
        except RenderDeferred:
            self.deferred += 1
            if self.deferred == 2:
                self.held.release.set()
            raise


async def test_a_tenants_notifications_waiting_for_its_turn_are_deferred_and_the_batch_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slow = [row(f"b-{i}", tenant_id="t-b") for i in range(3)]
    other = row("a-1", tenant_id="t-a")
    rows = [*slow, other]
    addresses = {r.id: [Address(f"+1415555000{i}")] for i, r in enumerate(rows)}
    pipeline, provider, messages = build(monkeypatch, rows, addresses)
    pipeline.content = CountingContent(HeldRenderer())

    outcomes = by_event(rows, await asyncio.wait_for(pipeline.process(messages), 30))

    assert outcomes.pop("a-1").status == "sent"
    statuses = sorted((o.status, o.error_code, o.calls) for o in outcomes.values())
    assert statuses == [("delayed", "render_deferred", 0)] * 2 + [("sent", None, 1)]
    assert all(o.not_before is not None for o in outcomes.values() if o.status == "delayed")
    assert sorted(m.to for m in provider.sent) == ["+14155550000", "+14155550003"]


async def deferrals_behind_a_held_render(
    n: int, *, pace_s: float | None = None
) -> tuple[list[float], Content]:
    """The ``after_s`` of ``n`` of tenant t-b's renders deferred while its first render holds the
    turn (its pace ``pace_s``, if given, as if its renders had taken that), then the held render
    let go; and the ``Content`` they went through."""
    renderer = HeldRenderer()
    # Each deferral is asked for one wait after the last, and its after_s counts from then: at
    # 0.01 s, five deferrals' own waits came to 0.047-0.050 s of the 0.05 s the assertions allow.
    content = Content(pool=None, renderer=renderer, turn_wait_s=0.001)  # type: ignore[arg-type]
    holding = asyncio.create_task(content.render(row("b-0", tenant_id="t-b")))
    await renderer.entered.wait()
    if pace_s is not None:
        content._pace["t-b"] = pace_s
    waits = []
    for i in range(1, n + 1):
        with pytest.raises(RenderDeferred) as deferred:
            await content.render(row(f"b-{i}", tenant_id="t-b"))
        waits.append(deferred.value.after_s)
    renderer.release.set()
    await holding
    return waits, content


async def test_deferrals_are_booked_one_render_apart_at_the_tenants_pace() -> None:
    """Deferred alike (1 s), a backlog came back together and was mostly deferred again: a claim
    and a record of each row on the shared database every cycle."""
    waits, content = await deferrals_behind_a_held_render(5, pace_s=0.4)
    # Booked one render after the last (a second from now at the soonest), not all alike at 1 s.
    assert waits == pytest.approx([1.4, 1.8, 2.2, 2.6, 3.0], abs=0.05)
    assert content.renderer.turns._turns == {}  # nobody waits: nothing kept


async def test_bookings_stay_within_max_defer_s_however_many_were_deferred() -> None:
    """Spaced by the deferrals made, two lanes' overlapping batches drifted out for hours (a
    review: 2,253 s, rows still unsent after 600 s)."""
    waits, _ = await deferrals_behind_a_held_render(5, pace_s=100.0)  # the bookings pass 300 s
    assert waits == pytest.approx([101, 201, MAX_DEFER_S, MAX_DEFER_S, MAX_DEFER_S], abs=0.5)


async def test_before_any_render_was_timed_deferrals_are_booked_at_the_cap_not_all_alike() -> None:
    """Learnt per batch from zero, a backlog whose first render held the turn came back all at
    once, every deferral 1 s (a review: 200 deferred, spread 0.0 s)."""
    waits, content = await deferrals_behind_a_held_render(3)
    cap = RENDER_PACE_CAP_S
    assert waits == pytest.approx([1 + cap, 1 + 2 * cap, 1 + 3 * cap], abs=0.05)
    assert content._pace["t-b"] <= cap  # the held render is timed, capped, and kept for the next batch


async def test_a_render_waiting_for_the_renderers_own_turn_is_deferred() -> None:
    """One turn: the worker's bound is on the renderer's turn itself. With a turn of the worker's
    own around the renderer's, the bound covered the outer one only, and whatever else held the
    renderer's turn for the tenant held the worker's render without bound (this test holds it
    directly; nothing in the worker does today)."""
    renderer = Renderer()
    content = Content(pool=None, renderer=renderer, turn_wait_s=0.05)  # type: ignore[arg-type]
    async with turn_held(renderer, "t-b") as release:
        with pytest.raises(RenderDeferred):
            await asyncio.wait_for(content.render(row("b-1", tenant_id="t-b")), 5)
        release.set()
    assert (await content.render(row("b-2", tenant_id="t-b"))).body == "Your code is 42"
    assert renderer.turns._turns == {}
