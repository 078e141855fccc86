"""Render: what a claimed notification says, from its inline content or its stored template.

A stored template is looked up once per (tenant, name, channel, locale, version) and kept: a
published version never changes. The render itself runs on the renderer's threads with the limits
of ``core.render``; the worker renders what the API accepted, so it never refuses a tenant for
its render CPU share (``cpu_share=False``).

One tenant's renders run one at a time (the renderer's turns), and a batch is recorded only when
its last notification is done. So a tenant's notifications wait at most ``turn_wait_s`` for their
turn; past that, ``RenderDeferred``: the pipeline holds them a moment (``delayed``) for a later
batch instead of keeping everyone else's outcomes, and the next batch, waiting for them. Before,
53 sends of one tenant with legal 140 ms templates, due at once, held a batch for 22 s, and
another tenant's SMS sent a second later took 23 s instead of 0.9 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from core.render import RenderedContent, Renderer, RenderError
from core.templates import resolve_template
from workers.claim import ClaimedNotification
from workers.email_tracking import EmailTracking

Source = tuple[str | None, str, str | None, bool | None]  # subject (or push title), body, html, tracked

TURN_WAIT_S = 2.0


class RenderDeferred(Exception):
    """This tenant's earlier notifications are still rendering: deliver this one in a later batch."""


class _Turn:
    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0


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
                raise RenderDeferred(tenant) from None
            try:
                yield
            finally:
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
