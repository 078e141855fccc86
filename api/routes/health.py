"""Liveness and readiness."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        503: {
            "description": "The database is unreachable: take this process out of the load balancer.",
            "content": {"application/json": {"example": {"status": "unavailable", "database": "OSError"}}},
        }
    },
)
async def readyz(request: Request) -> JSONResponse:
    try:
        async with request.app.state.engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))
    except Exception as exc:
        return JSONResponse({"status": "unavailable", "database": type(exc).__name__}, status_code=503)
    return JSONResponse({"status": "ready"})
