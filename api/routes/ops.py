"""Operators: GET /v1/ops/queues (admin scope) and the dashboard page at /ops.

The page and its script are served from ``api/static`` (no CDN); the page asks for an admin API
key and calls the API with it, so it needs no session of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse

from api.auth import require
from api.ops import QueueMonitor, QueuesOut
from clarion.tenants import Principal

router = APIRouter(tags=["operations"])

STATIC = Path(__file__).resolve().parent.parent / "static"
MAX_WINDOW_S = 7 * 24 * 3600


@router.get("/v1/ops/queues", response_model=QueuesOut)
async def queues(
    request: Request,
    principal: Annotated[Principal, Depends(require("admin"))],
    window_s: Annotated[
        int, Query(ge=60, le=MAX_WINDOW_S, description="counts cover notifications created this recently")
    ] = 3600,
) -> QueuesOut:
    monitor: QueueMonitor = request.app.state.queues
    return await monitor.report(tenant_id=principal.tenant_id, window_s=window_s)


@router.get("/ops", include_in_schema=False)
async def dashboard() -> FileResponse:
    return FileResponse(STATIC / "ops.html", media_type="text/html", headers={"Cache-Control": "no-store"})


@router.get("/ops/ops.js", include_in_schema=False)
async def dashboard_script() -> FileResponse:
    return FileResponse(
        STATIC / "ops.js", media_type="text/javascript", headers={"Cache-Control": "no-store"}
    )
