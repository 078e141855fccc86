"""Accepting up to 1,000 sends in one request, each on its own: one bad item never sinks the rest."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from pydantic import ValidationError

from api.accept import AcceptResult, accept_notification
from api.errors import ApiError, validation_error
from api.models import BatchItemOut, NotificationIn
from clarion.tenants import Principal
from workers.render import Renderer

CONCURRENCY = 8


async def accept_batch(
    *, pool: asyncpg.Pool, renderer: Renderer, principal: Principal, items: list[dict[str, Any]]
) -> list[tuple[BatchItemOut, AcceptResult | None]]:
    """Accept each item as ``POST /v1/notifications`` would, in its own transaction.

    Returns, in order, each item's result with the accepted notification (None when refused or a
    duplicate of an earlier send): the caller publishes those.
    """
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(index: int, raw: dict[str, Any]) -> tuple[BatchItemOut, AcceptResult | None]:
        try:
            req = NotificationIn.model_validate(raw)
            async with slots:
                result = await accept_notification(pool=pool, renderer=renderer, principal=principal, req=req)
        except ValidationError as exc:
            return _refused(index, validation_error(exc.errors(include_url=False))), None
        except ApiError as exc:
            return _refused(index, exc), None
        out = BatchItemOut(index=index, id=result.id, status=result.status, duplicate=result.duplicate)
        return out, result

    return list(await asyncio.gather(*(one(i, raw) for i, raw in enumerate(items))))


def _refused(index: int, error: ApiError) -> BatchItemOut:
    return BatchItemOut(
        index=index, error={"code": error.code, "message": error.message, "details": error.details}
    )
