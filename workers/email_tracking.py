"""Clarion's own email tracking for one worker: whether a notification is tracked, and its HTML
with the links and the open pixel of ``core.email_tracking``.

Off by default. A tenant turns it on for all its email (``PUT /v1/tenant/settings``
``{"email_tracking": true}``) and a template version overrides that either way (``track_email``
true or false; null follows the tenant). Inline content follows the tenant. Clarion's own
unsubscribe and preference links are never rewritten: they must work without a detour.

The tenant's setting is read once per ``TENANT_TTL_S`` per worker (one indexed read per tenant,
not per notification); a change reaches every worker within that.
"""

from __future__ import annotations

import time
from dataclasses import replace

import asyncpg

from clarion.tracking_tokens import make_tracking_token
from core.email_tracking import track_html
from core.render import RenderedContent
from workers.claim import ClaimedNotification

TENANT_TTL_S = 30.0
CLICK_PATH = "/t/c/"
OPEN_PATH = "/t/o/"


class EmailTracking:
    """Decides and applies email tracking; one per worker."""

    def __init__(self, *, pool: asyncpg.Pool, secret: str, base_url: str) -> None:
        self.pool = pool
        self.secret = secret
        self.base_url = base_url.rstrip("/")
        self._own = (f"{self.base_url}/v1/unsubscribe", f"{self.base_url}/preferences")
        self._tenants: dict[str, tuple[bool, float]] = {}

    async def tracks(self, n: ClaimedNotification, *, template_says: bool | None) -> bool:
        """Whether ``n``'s email is tracked: the template's choice, else its tenant's."""
        if template_says is not None:
            return template_says
        cached = self._tenants.get(n.tenant_id)
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        on = bool(await self.pool.fetchval("SELECT email_tracking FROM tenants WHERE id = $1", n.tenant_id))
        self._tenants[n.tenant_id] = (on, time.monotonic() + TENANT_TTL_S)
        return on

    def apply(self, n: ClaimedNotification, content: RenderedContent) -> RenderedContent:
        """``content`` with its HTML tracked (the text part has no links to rewrite or pixel)."""
        if content.html is None:
            return content

        def url(path: str, link: str | None) -> str:
            token = make_tracking_token(
                secret=self.secret, tenant_id=n.tenant_id, notification_id=n.id, link=link
            )
            return f"{self.base_url}{path}{token}"

        tracked = track_html(
            content.html,
            click_url=lambda link: url(CLICK_PATH, link),
            open_url=url(OPEN_PATH, None),
            keep=lambda link: link.startswith(self._own),
        )
        return replace(content, html=tracked)
