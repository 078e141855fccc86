"""Group commit for single sends: concurrent ``POST /v1/notifications`` share transactions.

On these machines a database round trip costs far more than the rows it carries (docs/findings.md: the
per-request insert was the bottleneck of a plain pipeline). Each request hands its send to the
:class:`AcceptQueue`, a :class:`clarion.coalesce.Coalescer` that runs everything waiting as one
:func:`api.accept.accept_many` transaction whenever a connection slot is free: a lone send on an
idle API is accepted at once, a busy API accepts tens of sends per transaction. Each caller still
hears ``202`` only after the transaction holding its row has committed.

A shared transaction that fails is retried one send at a time (:func:`accept_isolated`), so a send
the database refuses (a NUL character in its data, say) fails alone; when the database is down,
every send fails the same way, at once. One refused because its day has no partition of the log
(the upkeep has not made it: ``clarion.missing_days``) is tried again once, whole, after that day
is created.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime

import asyncpg

from api.accept import accept_many
from api.accept_checks import require_subject
from api.accepted_counts import AcceptedCounts
from api.errors import db_unavailable, is_db_unavailable
from api.submission import AcceptDecision, AcceptResult, Prerendered, Submission
from clarion.coalesce import Coalescer
from clarion.missing_days import create_missing_day, missing_day
from core.analytics import RollupKey, hour_of
from core.render import Renderer, RenderError
from schema.enums import Channel

log = logging.getLogger(__name__)


async def accept_isolated(
    *,
    pool: asyncpg.Pool,
    renderer: Renderer,
    counts: AcceptedCounts,
    sends: Sequence[Submission],
    day_made: bool = False,
) -> list[AcceptDecision | Exception]:
    """Accept ``sends`` together; if that transaction fails, accept each alone. Returns, in order,
    each send's decision or the exception its own transaction raised; what was accepted is added
    to ``counts`` (the ``accepted`` rollups, written once a second). A transaction refused for a
    missing day of the log creates it and is tried again once (unless ``day_made``)."""
    try:
        async with pool.acquire() as conn:
            decisions: list[AcceptDecision | Exception] = list(
                await accept_many(conn=conn, renderer=renderer, sends=sends)
            )
        counts.add(accepted_keys(sends=sends, decisions=decisions))
        return decisions
    except Exception as exc:
        if not day_made and (missing := missing_day(exc)) is not None:
            try:
                async with pool.acquire() as conn:
                    await create_missing_day(conn=conn, missing=missing)
            except Exception as failed:  # the upkeep holds the parent, say: the caller tries again
                log.warning("the log's missing day was not created (%s)", type(failed).__name__)
                return [db_unavailable()] * len(sends)
            return await accept_isolated(
                pool=pool, renderer=renderer, counts=counts, sends=sends, day_made=True
            )
        if len(sends) == 1 or is_db_unavailable(exc):
            return [exc] * len(sends)
        log.info(  # the class only: a database error's text can quote a sent value
            "a shared accept of %d sends failed (%s); accepting them one by one",
            len(sends),
            type(exc).__name__,
        )
    return [(await accept_isolated(pool=pool, renderer=renderer, counts=counts, sends=[s]))[0] for s in sends]


def accepted_keys(
    *, sends: Sequence[Submission], decisions: Sequence[AcceptDecision | Exception]
) -> list[RollupKey]:
    """The ``accepted`` rollup row of each send just committed (``core.analytics``), a duplicate
    counting nothing: outside the transaction, so concurrent accepts never wait on each other for a
    rollup row (``api.accepted_counts`` writes them)."""
    hour = hour_of(datetime.now(UTC))
    return [
        RollupKey(
            tenant_id=send.principal.tenant_id, hour=hour, channel=send.req.channel.value,
            template=send.req.template or "", template_version=decision.template_version or 0,
            category=send.req.category or "",
        )
        for send, decision in zip(sends, decisions, strict=True)
        if isinstance(decision, AcceptResult) and not decision.duplicate
    ]  # fmt: skip


class AcceptQueue:
    """Accepts single sends in shared transactions (see the module docstring).

    ``max_in_flight`` transactions run at once: with one, sends queue behind each transaction's
    round trips, and one transaction waiting on a lock holds every single send; with many,
    batches shrink and each send pays more CPU (planning and commit are per transaction). Two A/B
    pairs of ``python -m bench.e2e`` (wrk, 64 connections, 2 cores, 2026-11-28), 2 against 4:
    PostgreSQL's CPU per notification -13% and -16%, the whole machine's -6% and -9%, accept p99
    59 -> 49 and 67 -> 52 ms; 1 saved more in one pair and less in the other. Measure again before
    changing it.
    """

    def __init__(
        self,
        *,
        pool: asyncpg.Pool,
        renderer: Renderer,
        counts: AcceptedCounts,
        max_batch: int = 256,
        max_in_flight: int = 2,
    ) -> None:
        self._pool, self._renderer, self._counts = pool, renderer, counts

        async def run(sends: list[Submission]) -> list[AcceptDecision | Exception]:
            return await accept_isolated(pool=pool, renderer=renderer, counts=counts, sends=sends)

        self._sends: Coalescer[Submission, AcceptResult] = Coalescer(
            run, max_batch=max_batch, max_in_flight=max_in_flight, name="clarion-accept"
        )

    async def accept(self, send: Submission) -> AcceptResult:
        """The send's result once its row is committed; raises the ``ApiError`` that refused it, or
        what the database raised.

        A send shares a transaction with whatever else is waiting, so nothing slow may happen in
        it on one tenant's behalf: inline content is rendered before the send joins (the outcome
        travels with it, so refusals keep their order: a repeat is still answered as a repeat),
        and a tenant whose recent renders ran past its CPU share has its templated sends accepted
        alone. Measured (chaos scenario 8): with every render inside the shared transactions,
        tenant B's template bombs took A's accept p99 from 177 ms to 907 ms.
        """
        if send.req.content is not None:
            send = await prerender(self._renderer, send)
        elif self._renderer.owes(send.principal.tenant_id):
            [decision] = await accept_isolated(
                pool=self._pool, renderer=self._renderer, counts=self._counts, sends=[send]
            )
            if isinstance(decision, Exception):
                raise decision
            return decision
        return await self._sends.submit(send)


async def prerender(renderer: Renderer, send: Submission) -> Submission:
    """``send`` with its inline content rendered (``Submission.rendered``), outside any transaction."""
    assert send.req.content is not None
    content, req = send.req.content, send.req
    try:
        rendered = await renderer.render_async(
            subject=content.subject if req.channel is Channel.email else content.title,
            body=content.body,
            html=content.html,
            data=req.data,
            budget=send.render_budget,
            tenant=send.principal.tenant_id,
        )
        require_subject(req.channel, rendered)
    except RenderError as exc:
        return replace(send, rendered=Prerendered(exc))
    return replace(send, rendered=Prerendered(None))
