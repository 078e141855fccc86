"""Delivery of a batch of notifications, in the words of the domain:

claim -> screen (preferences, quiet hours, expiry) -> address -> render -> gate (content dedupe,
caps, pacing) -> send -> conclude -> record.

Each step is a call into the module named after it: ``claim``, ``steps`` (the screens and gates
``wiring`` chose for the channel), ``recipients``, ``content`` (``render_deferral`` when the
tenant's render turn is busy), ``send``, ``conclude`` and ``record``. Every step either moves the notification forward or ends it with an ``Outcome``; one
notification's fault ends that notification alone (``_deliver_isolated``). The caller records the
outcomes as they come (``workers.recording``, retrying until done) and only after the last one
commits the batch's offsets. When tracing is on,
the claim, the render, every provider call and the record add their spans (``workers.traces``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from uuid import UUID

import asyncpg
import redis.exceptions
from pydantic import ValidationError

from clarion import metrics, tracing
from core.render import RenderedContent, RenderError
from schema.enums import Channel, Status
from schema.messages import NotificationMessage
from workers.claim import ClaimedNotification, Unreadable, claim
from workers.conclude import Calls, conclude, unless_expired
from workers.content import Content, RenderDeferred
from workers.expiry import ExpiryScreen
from workers.outcome import Attempt, Outcome
from workers.recipients import Address, addresses_for
from workers.record import record
from workers.render_deferral import deferred
from workers.retry import RetryPolicy
from workers.send import Sender
from workers.steps import Gate, Screen
from workers.traces import claim_spans, provider_spans, record_spans

log = logging.getLogger(__name__)

# Faults of the infrastructure, not of the notification: it is retried, not failed.
PASSING_FAULTS: tuple[type[BaseException], ...] = (
    OSError,  # ConnectionError, TimeoutError
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.TooManyConnectionsError,
    # SQLSTATE 57P01-57P03: the server shutting down, crashed, or starting up (a restart). The
    # chaos database-restart scenario failed a notification on CannotConnectNowError before this;
    # the API answers these 503 (api/errors.py, is_db_unavailable).
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


@dataclass(frozen=True, slots=True)
class Poison:
    raw: bytes
    error: str


def decode(
    values: list[bytes], traceparents: Sequence[str | None] | None = None
) -> tuple[list[NotificationMessage], list[Poison]]:
    """Split a batch into messages and undecodable records (which go to the DLQ, not a retry loop).
    ``traceparents``, when given, are the records' trace headers, in the same order."""
    good: list[NotificationMessage] = []
    bad: list[Poison] = []
    for i, value in enumerate(values):
        try:
            good.append(NotificationMessage.model_validate_json(value))
            if traceparents is not None:
                good[-1].traceparent = traceparents[i]
        except ValidationError as exc:
            bad.append(Poison(value, exc.errors(include_url=False)[0]["msg"] if exc.errors() else str(exc)))
    return good, bad


@dataclass(kw_only=True, eq=False)
class Pipeline:
    """Delivers batches of notifications for one channel."""

    channel: Channel
    pool: asyncpg.Pool
    content: Content
    sender: Sender
    policy: RetryPolicy
    lease_s: float
    concurrency: InitVar[int]  # provider calls in flight at most (``_slots``)
    max_claims: int = 5
    max_deferrals: int = 200  # render deferrals before dead (``render_deferral``)
    screens: list[Screen] = field(default_factory=list)  # the expiry screen is added last
    gates: list[Gate] = field(default_factory=list)
    _slots: asyncio.Semaphore = field(init=False)
    # event ids of processed, not yet recorded outcomes, and their claim spans (traceparents) when tracing
    _events: dict[UUID, str] = field(init=False, default_factory=dict)
    _traces: dict[UUID, str] = field(init=False, default_factory=dict)

    def __post_init__(self, concurrency: int) -> None:
        self.screens = [*self.screens, ExpiryScreen()]
        self.gates = list(self.gates)
        self._slots = asyncio.Semaphore(concurrency)

    async def process(
        self, messages: list[NotificationMessage], *, done: Callable[[Outcome], None] = lambda _: None
    ) -> list[Outcome]:
        """Claim the batch and take every claimed notification to an outcome (provider calls
        included), each handed to ``done`` as soon as it is reached (``workers.recording`` records
        them while the rest of the batch goes on). Nothing is recorded here: the caller must
        ``record`` these outcomes, retrying until it succeeds, because claiming again would find
        them leased and send nothing."""
        start_ns = time.time_ns() if tracing.enabled else 0
        claimed, unreadable = await claim(pool=self.pool, ids=[m.id for m in messages], lease_s=self.lease_s)
        if tracing.enabled:
            taken = {n.id for n in claimed} | {u.id for u in unreadable}
            self._traces.update(claim_spans(messages, taken, start_ns=start_ns, end_ns=time.time_ns()))
        skipped = len({m.id for m in messages}) - len(claimed) - len(unreadable)
        if skipped:
            metrics.DEDUPED.labels(self.channel.value).inc(skipped)
        self._events.update({n.id: n.event_id for n in claimed})
        self._events.update({u.id: u.event_id for u in unreadable})
        stopped = {u.id: self._unreadable(u) for u in unreadable}
        stopped.update({n.id: self._claimed_too_often(n) for n in claimed if n.claims > self.max_claims})
        for screen in self.screens:
            open_ = [n for n in claimed if n.id not in stopped]
            if open_:
                stopped.update(await self._screen_isolated(screen, open_))
        for outcome in stopped.values():
            done(outcome)
        go = [n for n in claimed if n.id not in stopped]
        if not go:
            return list(stopped.values())
        addresses = await addresses_for(pool=self.pool, rows=go)
        delivered = await asyncio.gather(*(self._deliver_isolated(n, addresses[n.id], done) for n in go))
        return [*stopped.values(), *delivered]

    async def record(self, outcomes: list[Outcome]) -> None:
        """Record the outcomes (one transaction), then count and log them."""
        start_ns = time.time_ns() if tracing.enabled else 0
        await record(pool=self.pool, channel=self.channel, outcomes=outcomes, events=self._events)
        if tracing.enabled:
            record_spans(self._traces, outcomes, start_ns=start_ns, end_ns=time.time_ns())

    async def _deliver(self, n: ClaimedNotification, addresses: list[Address], calls: Calls) -> Outcome:
        """One notification, from its addresses to its outcome."""
        if not addresses:
            return Outcome(
                notification_id=n.id,
                status=Status.suppressed,
                error_code="no_contact",
                error_message=f"the user has no {_CONTACT[self.channel]}",
                detail="no_contact",
            )
        try:
            content = await self._render(n)
        except RenderDeferred as later:
            return deferred(
                notification=n, after_s=later.after_s, max_deferrals=self.max_deferrals, channel=self.channel
            )
        except RenderError as exc:
            return Outcome(
                notification_id=n.id,
                status=Status.failed,
                error_code=f"render_{exc.code}",
                error_message=exc.message,
            )
        for gate in self.gates:
            stop = await gate.admit(n, content, addresses)
            if stop is not None:
                return stop
        async with self._slots:
            await self.sender.send(n, content, addresses, calls)
        return conclude(notification=n, calls=calls, policy=self.policy, now=datetime.now(UTC))

    async def _render(self, n: ClaimedNotification) -> RenderedContent:
        if not tracing.enabled:
            return await self.content.render(n)
        attributes = {"clarion.notification_id": str(n.id), "clarion.template": n.template or "(inline)"}
        with tracing.span("clarion.render", parent=self._traces.get(n.id), attributes=attributes):
            return await self.content.render(n)

    # -- when a notification cannot be judged -------------------------------------------------

    def _claimed_too_often(self, n: ClaimedNotification) -> Outcome:
        """Claimed ``max_claims`` times and never recorded: whatever happens to it (a worker dying
        on it, a fault no ``except`` can catch) would happen again, so it goes dead to the DLQ."""
        metrics.INTERNAL_ERRORS.labels(self.channel.value, "MaxClaims").inc()
        return Outcome(
            notification_id=n.id,
            status=Status.dead,
            error_code="max_claims",
            error_message=f"claimed {self.max_claims} times without reaching an outcome",
            detail=f"dead after {self.max_claims} claims without an outcome (CLARION_MAX_CLAIMS)",
        )

    def _unreadable(self, u: Unreadable) -> Outcome:
        metrics.INTERNAL_ERRORS.labels(self.channel.value, u.error).inc()
        now = datetime.now(UTC)
        fault = Attempt(
            notification_id=u.id, attempt=u.attempts + 1, provider="none", recipient=None, started_at=now,
            finished_at=now, outcome="permanent", error_code="internal_error", error_message=u.error,
        )  # fmt: skip
        return Outcome(
            notification_id=u.id,
            status=Status.failed,
            error_code="internal_error",
            error_message=f"{u.error} while delivering this notification",
            attempts=(fault,),
        )

    async def _screen_isolated(self, screen: Screen, rows: list[ClaimedNotification]) -> dict[UUID, Outcome]:
        """A screen over the whole batch; when it raises, it is asked row by row, so only the rows
        it cannot judge fail (``internal_error``), never their neighbours."""
        try:
            return await screen.screen(rows)
        except Exception:
            pass
        stopped: dict[UUID, Outcome] = {}
        for n in rows:
            try:
                stopped.update(await screen.screen([n]))
            except Exception as exc:
                stopped[n.id] = self._internal_error(n, exc, [])
        return stopped

    async def _deliver_isolated(
        self, n: ClaimedNotification, addresses: list[Address], done: Callable[[Outcome], None]
    ) -> Outcome:
        """``_deliver``, where any exception ends this notification alone: ``failed`` with
        ``internal_error``, or ``sent`` when a provider had already accepted it (a provider call
        that happened is always recorded, with its attempt row). An infrastructure fault
        (``PASSING_FAULTS``) makes it ``retrying`` instead, within its attempt budget."""
        calls = Calls()
        try:
            outcome = await self._deliver(n, addresses, calls)
        except Exception as exc:
            outcome = self._internal_error(n, exc, calls.attempts)
        finally:
            if tracing.enabled:
                provider_spans(self._traces.get(n.id), calls.attempts)
        done(outcome)
        return outcome

    def _internal_error(self, n: ClaimedNotification, exc: Exception, attempts: list[Attempt]) -> Outcome:
        kind = type(exc).__name__
        metrics.INTERNAL_ERRORS.labels(self.channel.value, kind).inc()
        log.error(
            "notification failed on an internal error (%s)",
            kind,
            extra={"notification_id": n.id, "event_id": n.event_id, "channel": self.channel.value},
            exc_info=log.isEnabledFor(logging.DEBUG),  # a traceback may quote the tenant's data
        )
        delivered = [a for a in attempts if a.outcome == "sent"]
        if delivered:
            return Outcome(
                notification_id=n.id,
                status=Status.sent,
                calls=len(attempts),
                provider=delivered[0].provider,
                provider_message_id=",".join(a.provider_message_id or "" for a in delivered),
                detail=f"sent; then {kind} while concluding",
                attempts=tuple(attempts),
            )
        now = datetime.now(UTC)
        passing = isinstance(exc, PASSING_FAULTS)
        total = n.attempts + len(attempts) + 1
        fault = Attempt(
            notification_id=n.id, attempt=total, provider="none", recipient=None, started_at=now, finished_at=now,
            outcome="transient" if passing else "permanent", error_code="internal_error", error_message=kind,
        )  # fmt: skip
        failed = Outcome(
            notification_id=n.id,
            status=Status.failed,
            calls=len(attempts),
            error_code="internal_error",
            error_message=f"{kind} while delivering this notification",
            attempts=(*attempts, fault),
        )
        if not passing:
            return failed
        # The database or Redis away for a moment: tried again later, the fault counted as an
        # attempt, so a fault that never passes ends dead after max_attempts, never loops.
        if self.policy.exhausted(total):
            return replace(
                failed, status=Status.dead, calls=len(attempts) + 1, detail=f"gave up after {total} attempts"
            )
        not_before = now + timedelta(seconds=self.policy.next_delay_s(total))
        return unless_expired(
            n, replace(failed, status=Status.retrying, calls=len(attempts) + 1, not_before=not_before)
        )


_CONTACT = {Channel.email: "email address", Channel.sms: "phone number", Channel.push: "active device"}
