"""A send on its way to the log: who asks, what, and what came of it (``api.accept`` decides).

Its own module so the accept steps (``accept``, ``accept_checks``, ``accept_queue``, ``batch``)
share these types without importing each other.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from uuid import UUID

from api.errors import ApiError
from api.models import NotificationIn
from clarion.tenants import Principal
from core.render import RenderError, RequestBudget
from schema.messages import NotificationMessage


@dataclass(frozen=True, slots=True)
class AcceptResult:
    id: UUID
    status: str
    duplicate: bool
    message: NotificationMessage | None  # None for a duplicate: nothing new to publish
    template_version: int | None = None  # the version pinned at accept (analytics rollups)


@dataclass(frozen=True, slots=True)
class Prerendered:
    """The outcome of rendering a send's inline content: ``error`` is what refused it, or None."""

    error: RenderError | None


@dataclass(frozen=True, slots=True)
class Submission:
    """One send to accept: who asks, what, and the hash that tells a repeat from a conflict."""

    principal: Principal
    req: NotificationIn
    digest: str
    render_budget: RequestBudget | None = None
    """CPU time for rendering shared with the other sends of the same request (a batch)."""
    rendered: Prerendered | None = None
    """Inline content already rendered before the send joined a shared transaction (``None``:
    not yet); :func:`api.accept_checks.check_content` then uses this outcome instead of rendering."""
    traceparent: str | None = None
    """The accept span's W3C trace context, kept with the notification (``clarion.tracing``);
    None when the API does not trace."""

    @classmethod
    def of(
        cls,
        principal: Principal,
        req: NotificationIn,
        render_budget: RequestBudget | None = None,
        traceparent: str | None = None,
    ) -> Submission:
        return cls(principal, req, request_hash(req), render_budget, traceparent=traceparent)

    @property
    def event_key(self) -> tuple[str, str]:
        return self.principal.tenant_id, self.req.event_id

    @property
    def user_key(self) -> tuple[str, str]:
        return self.principal.tenant_id, self.req.external_user_id


AcceptDecision = AcceptResult | ApiError


# A repeat's hash is compared with the one stored at the event id's first use, for as long as the
# key is kept (``CLARION_RETENTION_DAYS`` and more), so the canonical form must not change under
# stored hashes. A field added to ``NotificationIn`` or a model inside it would appear as null in
# every request's form, and each repeat of a send accepted before the upgrade would get 409
# ``event_id_conflict``. Such a field's dotted path goes here: it is left out of the form while it
# is None, so a request that does not use it keeps the hash it always had.
# ``tests/api/test_request_hash.py`` pins the fields hashed so far and two hashes.
UNHASHED_WHEN_UNSET: frozenset[str] = frozenset()


def request_hash(req: NotificationIn) -> str:
    """SHA-256 hex of the request's canonical JSON (fields sorted, defaults filled in)."""
    form = req.model_dump(mode="json")
    for path in UNHASHED_WHEN_UNSET:
        *parents, name = path.split(".")
        holder: object = form
        for parent in parents:
            holder = holder.get(parent) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and holder.get(name, 0) is None:
            del holder[name]
    canonical = json.dumps(form, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
