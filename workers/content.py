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
deferred come back one render apart, at the pace the tenant's renders held the turn here (at
least a second), so a backlog is not claimed and recorded again and again. The wait is bounded in
a turn of the worker's own around the renderer's, whose turns wait without bound when
``cpu_share`` is off, as it is here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from core.render import RenderedContent, Renderer, RenderError
from core.templates import resolve_template
from workers.claim import ClaimedNotification
from workers.email_tracking import EmailTracking

Source = tuple[str | None, str, str | None, bool | None]  # subject (or push title), body, html, tracked

TURN_WAIT_S = 2.0
MIN_DEFER_S = 1.0


class RenderDeferred(Exception):
    """This tenant's earlier notifications are still rendering: deliver this one in a later batch,
    ``after_s`` from now."""

    def __init__(self, tenant: str, after_s: float) -> None:
        super().__init__(tenant)
        self.after_s = after_s


class _Turn:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.deferred = 0  # while anyone waits: the deferrals so far, each a render later than the last
        self.render_s = 0.0  # how long the tenant's last render held the turn


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
        self._turns: dict[str, _Turn] = {}

    async def render(self, n: ClaimedNotification) -> RenderedContent:
        """The rendered content; raises ``RenderError`` (also when the template is gone), or
        ``RenderDeferred`` when the tenant's turn did not come within ``turn_wait_s``."""
        subject, body, html, track = await self._source(n)
        async with self._turn(n.tenant_id):
            content = await self.renderer.render_async(
                subject=subject, body=body, html=html, data=n.data, tenant=n.tenant_id, cpu_share=False
            )
        if (
            self.tracking is not None
            and html is not None
            and await self.tracking.tracks(n, template_says=track)
        ):
            content = self.tracking.apply(n, content)
        return content

    @asynccontextmanager
    async def _turn(self, tenant: str) -> AsyncIterator[None]:
        """The tenant's turn at rendering in this worker, waited for at most ``turn_wait_s``."""
        turn = self._turns.setdefault(tenant, _Turn())
        turn.waiting += 1
        try:
            try:
                async with asyncio.timeout(self.turn_wait_s):
                    await turn.lock.acquire()
            except TimeoutError:
                # Deferred one render apart, at the tenant's pace here: deferred all alike, a
                # backlog came back together and most of it was deferred again, each time a claim
                # and a record of every row on the shared database.
                turn.deferred += 1
                raise RenderDeferred(tenant, max(MIN_DEFER_S, turn.deferred * turn.render_s)) from None
            started = time.monotonic()
            try:
                yield
            finally:
                turn.render_s = time.monotonic() - started
                turn.lock.release()
        finally:
            turn.waiting -= 1
            if turn.waiting == 0:
                self._turns.pop(tenant, None)

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
