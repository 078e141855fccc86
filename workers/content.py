"""Render: what a claimed notification says, from its inline content or its stored template.

A stored template is looked up once per (tenant, name, channel, locale, version) and kept: a
published version never changes. The render itself runs on the renderer's threads with the limits
of ``core.render``; the worker renders what the API accepted, so it never refuses a tenant for
its render CPU share (``cpu_share=False``).
"""

from __future__ import annotations

import asyncpg

from core.render import RenderedContent, Renderer, RenderError
from core.templates import resolve_template
from workers.claim import ClaimedNotification
from workers.email_tracking import EmailTracking

Source = tuple[str | None, str, str | None, bool | None]  # subject (or push title), body, html, tracked


class Content:
    """Renders claimed notifications of one worker; caches the stored templates it used."""

    def __init__(
        self, *, pool: asyncpg.Pool, renderer: Renderer, tracking: EmailTracking | None = None
    ) -> None:
        self.pool = pool
        self.renderer = renderer
        self.tracking = tracking  # Clarion's own email tracking (workers/email_tracking.py)
        self._templates: dict[tuple[str, str, str, str | None, int | None], Source] = {}

    async def render(self, n: ClaimedNotification) -> RenderedContent:
        """The rendered content; raises ``RenderError`` (also when the template is gone)."""
        subject, body, html, track = await self._source(n)
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
