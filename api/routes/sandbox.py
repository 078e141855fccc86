"""/v1/sandbox/messages: what the sandbox provider would have sent (dev and test only)."""

from __future__ import annotations

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Depends, Query, Request

from api.auth import require
from api.models import SandboxMessageOut
from api.queries import sandbox_messages
from clarion.tenants import Principal

router = APIRouter(prefix="/v1/sandbox", tags=["sandbox"])


@router.get("/messages", response_model=list[SandboxMessageOut])
async def list_messages(
    request: Request,
    principal: Annotated[Principal, Depends(require("read"))],
    notification_id: UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> list[SandboxMessageOut]:
    return await sandbox_messages(
        request.app.state.engine, tenant_id=principal.tenant_id, notification_id=notification_id, limit=limit
    )
