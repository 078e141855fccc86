"""Queues: GET /v1/ops/queues (a tenant admin: its own figures, from the log), GET
/v1/ops/cluster/queues (the platform operator: every tenant and Kafka lag), and the page at /ops.

The page and its script are served from ``api/static`` (no CDN); the page asks for an admin API
key and calls the API with it, so it needs no session of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse

from api.auth import require, require_operator
from api.ops import QueueMonitor, QueuesOut
from clarion.tenants import Principal

router = APIRouter(tags=["operations"])

STATIC = Path(__file__).resolve().parent.parent / "static"
MAX_WINDOW_S = 7 * 24 * 3600
# The page handles an admin key: never inside another site's frame (clickjacking), and it shows
# tenants' values (event ids, user ids, error messages, provider answers): it writes them as text,
# and the policy runs no script but its own two files, so a value that ever reached the DOM as HTML
# could still not run, load anything, or send the key anywhere but this API; the sign-in form never
# submits (a key in the URL) even if its script did not load.
OPS_PAGE_CSP = (
    "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; "
    "img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
OPS_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": OPS_PAGE_CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

SCRIPT_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


@router.get("/v1/ops/queues", response_model=QueuesOut)
async def queues(
    request: Request,
    principal: Annotated[Principal, Depends(require("admin"))],
    window_s: Annotated[
        int, Query(ge=60, le=MAX_WINDOW_S, description="counts cover notifications created this recently")
    ] = 3600,
) -> QueuesOut:
    """The calling tenant's queues, from the log (Kafka's figures are the operator's)."""
    monitor: QueueMonitor = request.app.state.queues
    return await monitor.report(tenant_id=principal.tenant_id, window_s=window_s)


@router.get("/v1/ops/cluster/queues", response_model=QueuesOut, dependencies=[Depends(require_operator)])
async def cluster_queues(
    request: Request,
    window_s: Annotated[
        int, Query(ge=60, le=MAX_WINDOW_S, description="counts cover notifications created this recently")
    ] = 3600,
) -> QueuesOut:
    """Every tenant's queues and Kafka lag per partition: the platform operator's view
    (``Authorization: Bearer <CLARION_OPERATOR_TOKEN>``; no tenant key opens it)."""
    monitor: QueueMonitor = request.app.state.queues
    return await monitor.report(tenant_id=None, window_s=window_s)


@router.get("/ops", include_in_schema=False)
async def dashboard() -> FileResponse:
    return FileResponse(STATIC / "ops.html", media_type="text/html", headers=OPS_PAGE_HEADERS)


@router.get("/ops/analytics.js", include_in_schema=False)
async def dashboard_analytics_script() -> FileResponse:
    return FileResponse(STATIC / "analytics.js", media_type="text/javascript", headers=SCRIPT_HEADERS)


@router.get("/ops/ops.js", include_in_schema=False)
async def dashboard_script() -> FileResponse:
    return FileResponse(STATIC / "ops.js", media_type="text/javascript", headers=SCRIPT_HEADERS)
