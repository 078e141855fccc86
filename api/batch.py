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
    # Items repeating an event_id are accepted after the earlier item with it, so the later one is
    # the duplicate (or the 409), as if the items had been sent one by one in order.
    earlier: dict[str, asyncio.Event] = {}

    async def one(index: int, raw: dict[str, Any]) -> tuple[BatchItemOut, AcceptResult | None]:
        event_id = raw.get("event_id") if isinstance(raw, dict) else None
        before = earlier.get(event_id) if isinstance(event_id, str) else None
        done = asyncio.Event()
        if isinstance(event_id, str):
            earlier[event_id] = done
        try:
            if before is not None:
                await before.wait()
            return await _accept_one(index, raw)
        finally:
            done.set()

    async def _accept_one(index: int, raw: dict[str, Any]) -> tuple[BatchItemOut, AcceptResult | None]:
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
