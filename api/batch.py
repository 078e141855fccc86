"""Accepting up to 1,000 sends in one request, each on its own: one bad item never sinks the rest."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
from pydantic import ValidationError

from api.accept_checks import render_error
from api.accept_queue import accept_isolated
from api.accepted_counts import AcceptedCounts
from api.errors import ApiError, error_body, is_unstorable_value, validation_error
from api.models import BatchItemOut, NotificationIn
from api.submission import AcceptResult, Submission
from clarion.tenants import Principal
from core.render import Renderer, RenderError, RequestBudget

# One render budget for the whole request, not one per item: 20 items each spending the 200 ms
# per-render limit froze the API for 14 s before renders ran off the loop, and 1,000 would take
# minutes of render threads. Normal templates render in well under 1 ms each.
BATCH_RENDER_BUDGET_MS = 1_000
# A batch's renders are done within this, however long they waited for the render box (at nice 19
# on a loaded machine a second of CPU took over 10 s): its later items are refused, not its answer
# delayed past a client's timeout. Only render time counts (RequestBudget.rendering): the wait for
# the tenant's render turn and the renders, not the batch's database work between renders.
BATCH_RENDER_WALL_S = 5.0


async def accept_batch(
    *,
    pool: asyncpg.Pool,
    renderer: Renderer,
    counts: AcceptedCounts,
    principal: Principal,
    items: list[dict[str, Any]],
    traceparent: str | None = None,
) -> list[tuple[BatchItemOut, AcceptResult | None]]:
    """Accept each item as ``POST /v1/notifications`` would, all in one transaction when they can
    be (a value the database refuses sends the items through one by one).

    Returns, in order, each item's result with the accepted notification (None when refused or a
    duplicate of an earlier send): the caller publishes those. Items repeating an event_id are
    decided in order, so the later one is the duplicate (or the 409). Every item accepted keeps
    ``traceparent``, the request's accept span.
    """
    refused: dict[int, ApiError] = {}
    sends: list[tuple[int, Submission]] = []
    budget = RequestBudget(BATCH_RENDER_BUDGET_MS, wall_s=BATCH_RENDER_WALL_S)
    for index, raw in enumerate(items):
        if index:
            # An item's validation and hash cost the event loop in proportion to its data: up to
            # 4 MB of numbers in a batch made one turn of 1-2 s, every other request waiting.
            await asyncio.sleep(0)
        try:
            item = NotificationIn.model_validate(raw)
            sends.append((index, Submission.of(principal, item, budget, traceparent=traceparent)))
        except ValidationError as exc:
            refused[index] = validation_error(exc.errors(include_url=False))
    async with contextlib.AsyncExitStack() as stack:
        try:  # the items render back to back (RenderTurns.accept_turn); waiting for it is render time
            await stack.enter_async_context(renderer.turns.accept_turn(principal.tenant_id, budget=budget))
        except RenderError as exc:
            raise render_error(exc) from None
        decisions = await accept_isolated(
            pool=pool, renderer=renderer, counts=counts, sends=[send for _, send in sends]
        )
    accepted: dict[int, AcceptResult] = {}
    for (index, _), decision in zip(sends, decisions, strict=True):
        if isinstance(decision, AcceptResult):
            accepted[index] = decision
        elif isinstance(decision, ApiError):
            refused[index] = decision
        elif is_unstorable_value(decision):
            refused[index] = ApiError(
                422, "invalid_value", "A value cannot be stored (a NUL character, or a number out of range)."
            )
        else:
            raise decision
    results: list[tuple[BatchItemOut, AcceptResult | None]] = []
    for index in range(len(items)):
        if index in refused:
            results.append((_refused(index, refused[index]), None))
            continue
        result = accepted[index]
        out = BatchItemOut(index=index, id=result.id, status=result.status, duplicate=result.duplicate)
        results.append((out, result))
    return results


def _refused(index: int, error: ApiError) -> BatchItemOut:
    return BatchItemOut(index=index, error=error_body(error.code, error.message, error.details)["error"])
