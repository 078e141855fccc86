"""Render: what a claimed notification says, from its inline content or its stored template.

A stored template is looked up once per (tenant, name, channel, locale, version) and kept: a
published version never changes. The render itself runs on the renderer's threads with the limits
of ``core.render``; the worker renders what the API accepted, so it never refuses a tenant for
its render CPU share (``cpu_share=False``).

One tenant's renders run one at a time (the renderer's turns), and a batch is recorded only when
its last notification is done. So a tenant's notifications wait at most ``turn_wait_s`` for their
turn; past that, ``RenderDeferred``: the pipeline holds them (``delayed``) for a later batch
instead of keeping everyone else's outcomes, and the next batch, waiting for them. Before, 53
sends of one tenant with legal 140 ms templates, due at once, held a batch for 22 s, and another
tenant's SMS sent a second later took 23 s instead of 0.9 s (a helper's probe, 2026-11-28). The
deferred are booked one render apart after the tenant's last deferred one, at the pace its renders
hold the turn here, so a backlog is not claimed and recorded again and again. The wait is the
renderer's own turn, asked for with a bound (``RenderTurns.turn(wait_s=...)``, ``TurnNotReady`` past
it); the render inside re-enters that turn (``cpu_share`` off waits without bound, and need not).
How often one notification may be deferred is bounded in ``workers/render_deferral.py``.
"""

from __future__ import annotations

import time
from contextlib import AsyncExitStack

import asyncpg

from core.render import RenderedContent, Renderer, RenderError, TurnNotReady
from core.templates import resolve_template
from workers.claim import ClaimedNotification
from workers.email_tracking import EmailTracking

Source = tuple[str | None, str, str | None, bool | None]  # subject (or push title), body, html, tracked

TURN_WAIT_S = 2.0
MIN_DEFER_S = 1.0
MAX_DEFER_S = 300.0
RENDER_PACE_CAP_S = 0.25  # a render's CPU limit is 200 ms (core/render_limits.py)


class RenderDeferred(Exception):
    """This tenant's earlier notifications are still rendering: deliver this one in a later batch,
    ``after_s`` from now."""

    def __init__(self, tenant: str, after_s: float) -> None:
        super().__init__(tenant)
        self.after_s = after_s


class Content:
    """Renders claimed notifications of one worker; caches the stored templates it used."""

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        renderer: Renderer,
        tracking: EmailTracking | None = None,
        turn_wait_s: float = TURN_WAIT_S,
    ) -> None:
        self.pool = pool
        self.renderer = renderer
        self.tracking = tracking  # Clarion's own email tracking (workers/email_tracking.py)
        self.turn_wait_s = turn_wait_s
        self._templates: dict[tuple[str, str, str, str | None, int | None], Source] = {}
        self._booked: dict[str, float] = {}  # tenant -> when its last deferred render is booked for
        # tenant -> how long its renders hold the turn, smoothed and capped; kept between batches
        # (a review: learnt per batch, a backlog whose first render held the turn came back all at
        # once), and the cap until one was timed
        self._pace: dict[str, float] = {}

    async def render(self, n: ClaimedNotification) -> RenderedContent:
        """The rendered content; raises ``RenderError`` (also when the template is gone), or
        ``RenderDeferred`` when the tenant's turn did not come within ``turn_wait_s``."""
        subject, body, html, track = await self._source(n)
        started = time.monotonic()
        content = self.renderer.render_now(
            subject=subject, body=body, html=html, data=n.data, tenant=n.tenant_id, cpu_share=False
        )
        if content is not None:  # at once on the loop: the turn was free and the sources cheap
            self._paced(n.tenant_id, held_s=time.monotonic() - started)
        else:
            content = await self._render_in_turn(n, subject=subject, body=body, html=html)
        if (
            self.tracking is not None
            and html is not None
            and await self.tracking.tracks(n, template_says=track)
        ):
            content = self.tracking.apply(n, content)
        return content

    async def _render_in_turn(
        self, n: ClaimedNotification, *, subject: str | None, body: str, html: str | None
    ) -> RenderedContent:
        """The render in the tenant's turn, waited for at most ``turn_wait_s``."""
        async with AsyncExitStack() as stack:
            try:  # on entry only: once the turn is held, the render's own faults are its own
                await stack.enter_async_context(
                    self.renderer.turns.turn(n.tenant_id, wait_s=self.turn_wait_s)
                )
            except TurnNotReady:
                raise self._deferral(n.tenant_id) from None
            started = time.monotonic()
            try:
                return await self.renderer.render_async(
                    subject=subject, body=body, html=html, data=n.data, tenant=n.tenant_id, cpu_share=False
                )
            finally:
                self._paced(n.tenant_id, held_s=time.monotonic() - started)

    def _deferral(self, tenant: str) -> RenderDeferred:
        """``tenant``'s next render deferred: booked one render after its last deferred one (at
        least ``MIN_DEFER_S`` from now, the bookings at most ``MAX_DEFER_S`` ahead)."""
        # Deferred all alike (1 s), a backlog came back together and was deferred again and again,
        # each time a claim and a record of the row on the shared database; spaced by the
        # deferrals made so far, two lanes' overlapping batches drifted hours out (two reviews). A
        # review's simulation (1,000 rows of 140 ms renders due at once, batches of 500): 19.7
        # claims a row deferred alike, 6.8 by deferrals made, 2.2 booked; 4,000 rows: 3,891 and
        # 3,799 sent in 1,200 s, all 4,000 booked in 736 s.
        now = time.monotonic()
        last = min(self._booked.get(tenant, now), now + MAX_DEFER_S)
        booked = max(last, now + MIN_DEFER_S) + self._pace.get(tenant, RENDER_PACE_CAP_S)
        self._booked[tenant] = booked
        if len(self._booked) > 10_000:  # bookings passed hold nothing
            self._booked = {t: at for t, at in self._booked.items() if at > now}
        return RenderDeferred(tenant, min(MAX_DEFER_S, booked - now))

    def _paced(self, tenant: str, *, held_s: float) -> None:
        """Learn ``tenant``'s pace from one render that held its turn for ``held_s``."""
        # Wall time, which a render waiting for a thread or the box stretches: capped at what one
        # render may spend (a review: one 1.2 s wait made every later deferral of the batch ~10x
        # too long when only the last render counted).
        held_s = min(held_s, RENDER_PACE_CAP_S)
        pace = self._pace.get(tenant)
        self._pace[tenant] = held_s if pace is None else 0.8 * pace + 0.2 * held_s
        if len(self._pace) > 10_000:  # a tenant with nothing booked starts from the cap again
            self._pace = {t: pace for t, pace in self._pace.items() if t in self._booked}

    async def _source(self, n: ClaimedNotification) -> Source:
        if n.content is not None:
            return n.content.heading(n.channel), n.content.body, n.content.html, None
        key = (n.tenant_id, str(n.template), n.channel.value, n.locale, n.template_version)
        source = self._templates.get(key)
        if source is None:
            template = await resolve_template(
                conn=self.pool,
                tenant_id=n.tenant_id,
                name=str(n.template),
                channel=n.channel.value,
                locale=n.locale,
                version=n.template_version,
            )
            if template is None:
                raise RenderError("template_error", f"template '{n.template}' no longer exists")
            source = self._templates[key] = (
                template.subject,
                template.body,
                template.html,
                template.track_email,
            )
        return source
