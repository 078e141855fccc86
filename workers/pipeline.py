"""The story of one delivery, told for a batch of Kafka records:

decode -> claim (dedupe) -> screens (preferences, quiet hours) -> expiry -> contact -> render
-> gates (content dedupe, rate limits) -> send with retries -> record -> (ack).

Every step either moves the notification forward or records why it stopped; the offsets are
committed by the caller only after ``deliver`` has recorded the outcomes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg
import redis.exceptions
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion import metrics
from providers.base import Provider, RenderedMessage, SendResult
from providers.errors import (
    InvalidRecipient,
    PermanentProviderError,
    ProviderError,
    TransientProviderError,
)
from providers.registry import NoProviderConfigured, ProviderSet
from schema.enums import Channel, Priority, Status
from schema.messages import NotificationMessage
from workers.breaker import Breakers, CircuitOpen
from workers.dedupe import claim_batch
from workers.outcome import Attempt, Outcome, record_outcomes
from workers.recipients import Address, addresses_for, deactivate_device
from workers.render import RenderedContent, Renderer, RenderError
from workers.retry import RetryPolicy
from workers.steps import Gate, Row, Screen
from workers.templates import resolve_template_pg

log = logging.getLogger(__name__)

# Faults of the infrastructure, not of the notification: it is retried, not failed.
PASSING_FAULTS: tuple[type[BaseException], ...] = (
    OSError,  # ConnectionError, TimeoutError
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.TooManyConnectionsError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
)


@dataclass(frozen=True, slots=True)
class Poison:
    raw: bytes
    error: str


def decode(values: list[bytes]) -> tuple[list[NotificationMessage], list[Poison]]:
    """Split a batch into messages and undecodable records (which go to the DLQ, not a retry loop)."""
    good: list[NotificationMessage] = []
    bad: list[Poison] = []
    for value in values:
        try:
            good.append(NotificationMessage.model_validate_json(value))
        except ValidationError as exc:
            bad.append(Poison(value, exc.errors(include_url=False)[0]["msg"] if exc.errors() else str(exc)))
    return good, bad


class Pipeline:
    """Delivers batches of notifications for one channel."""

    def __init__(
        self,
        *,
        channel: Channel,
        pool: asyncpg.Pool,
        engine: AsyncEngine,
        providers: ProviderSet,
        renderer: Renderer,
        policy: RetryPolicy,
        lease_s: float,
        concurrency: int,
        max_claims: int = 5,
        screens: Sequence[Screen] = (),
        gates: Sequence[Gate] = (),
        unsubscribe_url: Callable[[Row], str | None] | None = None,
        on_provider_error: Callable[[ProviderError], None] | None = None,
        breakers: Breakers | None = None,
    ) -> None:
        self.channel = channel
        self.pool = pool
        self.engine = engine
        self.providers = providers
        self.renderer = renderer
        self.policy = policy
        self.lease_s = lease_s
        self.max_claims = max_claims
        self.screens = list(screens)
        self.gates = list(gates)
        self.unsubscribe_url = unsubscribe_url
        self.on_provider_error = on_provider_error  # e.g. adaptive pacing slows down on a 429
        self.breakers = breakers
        self._slots = asyncio.Semaphore(concurrency)
        self._events: dict[UUID, str] = {}  # event ids of processed, not yet recorded outcomes
        self._templates: dict[tuple[Any, ...], tuple[str | None, str, str | None]] = {}

    async def deliver(self, messages: list[NotificationMessage]) -> list[Outcome]:
        """Claim, deliver and record a batch; returns the recorded outcomes."""
        outcomes = await self.process(messages)
        await self.record(outcomes)
        return outcomes

    async def process(self, messages: list[NotificationMessage]) -> list[Outcome]:
        """Claim the batch and take every claimed notification to an outcome (provider calls
        included). Nothing is recorded yet: the caller must ``record`` these outcomes, retrying
        until it succeeds, because claiming again would find them leased and send nothing."""
        rows = await claim_batch(pool=self.pool, ids=[m.id for m in messages], lease_s=self.lease_s)
        skipped = len({m.id for m in messages}) - len(rows)
        if skipped:
            metrics.DEDUPED.labels(self.channel.value).inc(skipped)
        if not rows:
            return []
        stopped: dict[UUID, Outcome] = {
            r["id"]: self._claimed_too_often(r) for r in rows if r["claims"] > self.max_claims
        }
        for screen in self.screens:
            open_rows = [r for r in rows if r["id"] not in stopped]
            if open_rows:
                stopped.update(await self._screen_isolated(screen, open_rows))
        go = [r for r in rows if r["id"] not in stopped]
        addresses = await addresses_for(pool=self.pool, rows=go)
        outcomes = list(stopped.values())
        outcomes += await asyncio.gather(*(self._deliver_isolated(row, addresses[row["id"]]) for row in go))
        self._events.update({r["id"]: r["event_id"] for r in rows})
        return outcomes

    async def record(self, outcomes: list[Outcome]) -> None:
        """Record the outcomes (one transaction), then count and log them."""
        await record_outcomes(pool=self.pool, outcomes=outcomes)
        for o in outcomes:
            metrics.OUTCOMES.labels(self.channel.value, o.provider or "none", o.status).inc()
            # Ids, status and error code only: bodies and addresses never reach the logs.
            log.log(
                logging.DEBUG if o.status == Status.sent.value else logging.INFO,
                "notification %s%s",
                o.status,
                f" ({o.error_code})" if o.error_code else "",
                extra={
                    "notification_id": o.notification_id,
                    "event_id": self._events.pop(o.notification_id, None),
                    "channel": self.channel.value,
                    "provider": o.provider,
                },
            )
            for a in o.attempts:
                metrics.PROVIDER_LATENCY.labels(a.provider, a.outcome).observe(
                    (a.finished_at - a.started_at).total_seconds()
                )
                if a.error_code:
                    metrics.PROVIDER_ERRORS.labels(a.provider, a.error_code).inc()
            if o.status == Status.retrying.value:
                metrics.RETRIES.labels(self.channel.value).inc()

    def _claimed_too_often(self, row: Row) -> Outcome:
        """Claimed ``max_claims`` times and never recorded: whatever happens to it (a worker dying
        on it, a fault no ``except`` can catch) would happen again, so it goes dead to the DLQ."""
        metrics.INTERNAL_ERRORS.labels(self.channel.value, "MaxClaims").inc()
        return Outcome(
            notification_id=row["id"],
            status=Status.dead.value,
            error_code="max_claims",
            error_message=f"claimed {self.max_claims} times without reaching an outcome",
            detail=f"dead after {self.max_claims} claims without an outcome (CLARION_MAX_CLAIMS)",
        )

    async def _screen_isolated(self, screen: Screen, rows: list[Row]) -> dict[UUID, Outcome]:
        """A screen over the whole batch; when it raises, it is asked row by row, so only the rows
        it cannot judge fail (``internal_error``), never their neighbours."""
        try:
            return await screen.screen(rows)
        except Exception:
            pass
        stopped: dict[UUID, Outcome] = {}
        for row in rows:
            try:
                stopped.update(await screen.screen([row]))
            except Exception as exc:
                stopped[row["id"]] = self._internal_error(row, exc, [])
        return stopped

    async def _deliver_isolated(self, row: Row, addresses: list[Address]) -> Outcome:
        """``_deliver_one``, where any exception ends this notification alone: ``failed`` with
        ``internal_error``, or ``sent`` when a provider had already accepted it (a provider call
        that happened is always recorded, with its attempt row). An infrastructure fault
        (``PASSING_FAULTS``) makes it ``retrying`` instead, within its attempt budget."""
        attempts: list[Attempt] = []
        try:
            return await self._deliver_one(row, addresses, attempts)
        except Exception as exc:
            return self._internal_error(row, exc, attempts)

    def _internal_error(self, row: Row, exc: Exception, attempts: list[Attempt]) -> Outcome:
        kind = type(exc).__name__
        metrics.INTERNAL_ERRORS.labels(self.channel.value, kind).inc()
        log.error(
            "notification failed on an internal error (%s)",
            kind,
            extra={"notification_id": row["id"], "event_id": row["event_id"], "channel": self.channel.value},
            exc_info=log.isEnabledFor(logging.DEBUG),  # a traceback may quote the tenant's data
        )
        delivered = [a for a in attempts if a.outcome == "sent"]
        if delivered:
            return Outcome(
                notification_id=row["id"],
                status=Status.sent.value,
                calls=len(attempts),
                provider=delivered[0].provider,
                provider_message_id=",".join(a.provider_message_id or "" for a in delivered),
                detail=f"sent; then {kind} while concluding",
                attempts=attempts,
            )
        now = datetime.now(UTC)
        passing = isinstance(exc, PASSING_FAULTS)
        total = row["attempts"] + len(attempts) + 1
        outcome = Outcome(
            notification_id=row["id"],
            status=Status.failed.value,
            calls=len(attempts),
            error_code="internal_error",
            error_message=f"{kind} while delivering this notification",
            attempts=[
                *attempts,
                Attempt(row["id"], total, "none", None, now, now,
                        "transient" if passing else "permanent", "internal_error", kind),
            ],
        )  # fmt: skip
        if not passing:
            return outcome
        # The database or Redis away for a moment: tried again later, the fault counted as an
        # attempt, so a fault that never passes ends dead after max_attempts, never loops.
        outcome.calls += 1
        if self.policy.exhausted(total):
            outcome.status, outcome.detail = Status.dead.value, f"gave up after {total} attempts"
            return outcome
        outcome.status = Status.retrying.value
        outcome.not_before = now + timedelta(seconds=self.policy.next_delay_s(total))
        return self._unless_expired(row, outcome)

    async def _deliver_one(
        self, row: dict[str, Any], addresses: list[Address], attempts: list[Attempt]
    ) -> Outcome:
        nid: UUID = row["id"]
        now = datetime.now(UTC)
        if row["expires_at"] is not None and row["expires_at"] <= now:
            return Outcome(
                nid,
                Status.expired.value,
                error_code="expired",
                error_message="the notification's expires_at passed before it could be sent",
            )
        if not addresses:
            return Outcome(
                nid,
                Status.suppressed.value,
                error_code="no_contact",
                error_message=f"the user has no {_contact_name(self.channel)}",
                detail="no_contact",
            )
        try:
            content = await self._render(row)
        except RenderError as exc:
            return Outcome(
                nid, Status.failed.value, error_code=f"render_{exc.code}", error_message=exc.message
            )
        for gate in self.gates:
            stop = await gate.admit(row, content, addresses)
            if stop is not None:
                return stop
        async with self._slots:
            return await self._send_all(row, content, addresses, attempts)

    async def _render(self, row: dict[str, Any]) -> RenderedContent:
        if row["content"] is not None:
            c = row["content"]
            subject = c.get("subject") if self.channel is Channel.email else c.get("title")
            return await self.renderer.render_async(
                subject=subject,
                body=c["body"],
                html=c.get("html"),
                data=row["data"],
                tenant=row["tenant_id"],
                cpu_share=False,
            )
        key = (row["tenant_id"], row["template"], row["channel"], row["locale"], row["template_version"])
        source = self._templates.get(key)
        if source is None:
            template = await resolve_template_pg(
                conn=self.pool,
                tenant_id=row["tenant_id"],
                name=row["template"],
                channel=row["channel"],
                locale=row["locale"],
                version=row["template_version"],
            )
            if template is None:
                raise RenderError("template_error", f"template '{row['template']}' no longer exists")
            source = (template.subject, template.body, template.html)
            self._templates[key] = source  # a (name, locale, version) never changes: cache forever
        return await self.renderer.render_async(
            subject=source[0],
            body=source[1],
            html=source[2],
            data=row["data"],
            tenant=row["tenant_id"],
            cpu_share=False,
        )

    async def _send_all(
        self, row: dict[str, Any], content: RenderedContent, addresses: list[Address], attempts: list[Attempt]
    ) -> Outcome:
        nid: UUID = row["id"]
        results: list[SendResult] = []
        errors: list[ProviderError] = []
        opened: list[CircuitOpen] = []
        unsubscribe = (
            self.unsubscribe_url(row) if self.unsubscribe_url and self.channel is Channel.email else None
        )
        for address in addresses:
            message = RenderedMessage(
                notification_id=nid,
                tenant_id=row["tenant_id"],
                channel=self.channel,
                to=address.to,
                body=content.body,
                priority=Priority(row["priority"]),
                category=row["category"],
                subject=content.subject,
                html=content.html,
                platform=address.platform,
                data={k: str(v) for k, v in row["data"].items()} if self.channel is Channel.push else {},
                expires_at=row["expires_at"],
                unsubscribe_url=unsubscribe,
            )
            try:
                provider = self.providers.for_message(self.channel, address.platform)
            except NoProviderConfigured as exc:
                errors.append(ProviderError(str(exc), provider="none", code="no_provider"))
                continue
            chain = [provider]
            secondary = self.providers.failover_for(self.channel, provider)
            if secondary is not None:
                chain.append(secondary)
            try:
                result = await self._send_via(chain, message, row, attempts, errors)
            except CircuitOpen as exc:
                opened.append(exc)
                continue
            except ProviderError as exc:
                errors.append(exc)
                if self.on_provider_error is not None:
                    self.on_provider_error(exc)
                if isinstance(exc, InvalidRecipient) and address.platform is not None:
                    await deactivate_device(
                        pool=self.pool,
                        user_id=row["user_id"],
                        token=address.to,
                        reason=f"{exc.provider} {exc.code}: {exc.message}",
                    )
                continue
            results.append(result)
        return self._conclude(row, attempts, results, errors, opened)

    async def _send_via(
        self,
        chain: list[Provider],
        message: RenderedMessage,
        row: dict[str, Any],
        attempts: list[Attempt],
        errors: list[ProviderError],
    ) -> SendResult:
        """Send through the first provider of ``chain`` that delivers; a later one is tried only when
        the one before is unavailable (breaker open) or still failing transiently after its in-process
        attempts. Raises what the last provider raised (``CircuitOpen`` or a ``ProviderError``);
        earlier providers' errors go to ``errors``. Every call becomes an ``Attempt``."""
        nid: UUID = message.notification_id
        for i, provider in enumerate(chain):
            last = i == len(chain) - 1
            breaker = self.breakers.for_provider(provider.name) if self.breakers else None

            def on_attempt(
                started: datetime,
                finished: datetime,
                error: BaseException | None,
                _provider: str = provider.name,
                _breaker: Any = breaker,
            ) -> None:
                number = row["attempts"] + len(attempts) + 1
                attempts.append(_attempt_row(nid, number, _provider, message.to, started, finished, error))
                if _breaker is not None:
                    _breaker.record(
                        failed=error is not None and not isinstance(error, PermanentProviderError)
                    )

            try:
                result = await self.policy.run(
                    lambda p=provider: p.send(message),  # type: ignore[misc]
                    provider=provider.name,
                    on_attempt=on_attempt,
                    before_attempt=breaker.check if breaker is not None else None,
                    budget=self.policy.remaining(row["attempts"] + len(attempts)),
                )
            except (CircuitOpen, TransientProviderError) as exc:
                if last:
                    raise
                if isinstance(exc, TransientProviderError):
                    errors.append(exc)
                    if self.on_provider_error is not None:
                        self.on_provider_error(exc)
                log.info(
                    "%s unavailable (%s); failing over to %s",
                    provider.name,
                    getattr(exc, "code", None) or type(exc).__name__,
                    chain[i + 1].name,
                    extra={"notification_id": nid, "event_id": row["event_id"], "provider": provider.name},
                )
                continue
            except ProviderError:
                raise
            except Exception as exc:
                log.error(  # the class only: its text or traceback may quote the rendered message
                    "provider %s raised an unclassified %s",
                    provider.name,
                    type(exc).__name__,
                    extra={"notification_id": nid, "event_id": row["event_id"], "provider": provider.name},
                    exc_info=exc if log.isEnabledFor(logging.DEBUG) else None,
                )
                if not last:
                    continue
                raise TransientProviderError(
                    str(exc), provider=provider.name, code=type(exc).__name__
                ) from exc
            attempts[-1].outcome = "sent"
            attempts[-1].provider_message_id = result.provider_message_id
            attempts[-1].http_status = result.http_status
            return result
        raise AssertionError("unreachable: the chain is never empty")

    def _conclude(
        self,
        row: dict[str, Any],
        attempts: list[Attempt],
        results: list[SendResult],
        errors: list[ProviderError],
        opened: list[CircuitOpen] | None = None,
    ) -> Outcome:
        """The outcome of one notification's calls.

        ``sent`` when any address was delivered. Otherwise, with only permanent errors, ``failed``.
        With transient errors or open breakers it is rescheduled (``retrying`` at the retry
        schedule's next time, or at the breaker's reopen time when only breakers stood in the way;
        a breaker refusal consumes no attempt); ``dead`` once ``max_attempts`` calls are spent;
        ``expired`` when the next try would come after ``expires_at``.
        """
        nid: UUID = row["id"]
        opened = opened or []
        calls = len(attempts)
        if results:
            first = results[0]
            return Outcome(
                nid,
                Status.sent.value,
                calls,
                first.provider,
                ",".join(r.provider_message_id for r in results),
                attempts=attempts,
            )
        now = datetime.now(UTC)
        transient = [e for e in errors if isinstance(e, TransientProviderError)]
        if not errors or (not transient and opened):
            waits = [o.until for o in opened] or [now + timedelta(seconds=self.policy.retry_base_s)]
            last_open = opened[-1] if opened else None
            base = Outcome(
                nid,
                Status.retrying.value,
                calls,
                last_open.provider if last_open else None,
                None,
                "circuit_open",
                str(last_open) if last_open else "no provider call was possible",
                attempts=attempts,
            )
            base.not_before = min(waits)
            return self._unless_expired(row, base)
        last = errors[-1]
        base = Outcome(
            nid, Status.failed.value, calls, last.provider, None, last.code, last.message, attempts=attempts
        )
        if not transient:
            return base
        total = row["attempts"] + calls
        base.error_code, base.error_message = transient[-1].code, transient[-1].message
        if self.policy.exhausted(total):
            base.status, base.detail = Status.dead.value, f"gave up after {total} attempts"
            return base
        hint = max((e.retry_after_s or 0.0 for e in transient), default=0.0)
        base.status = Status.retrying.value
        base.not_before = now + timedelta(seconds=self.policy.next_delay_s(total, hint))
        if opened:
            base.not_before = max(base.not_before, min(o.until for o in opened))
        base.detail = f"attempt {total} failed; next try not before {base.not_before.isoformat()}"
        return self._unless_expired(row, base)

    def _unless_expired(self, row: dict[str, Any], outcome: Outcome) -> Outcome:
        expires_at: datetime | None = row["expires_at"]
        if expires_at is None or outcome.not_before is None or outcome.not_before < expires_at:
            return outcome
        outcome.status = Status.expired.value
        outcome.detail = (
            f"the next try ({outcome.not_before.isoformat()}) would come after expires_at; "
            f"last error {outcome.error_code}"
        )
        outcome.not_before = None
        return outcome


def _attempt_row(
    nid: UUID,
    number: int,
    provider: str,
    to: str,
    started: datetime,
    finished: datetime,
    error: BaseException | None,
) -> Attempt:
    if error is None:
        return Attempt(nid, number, provider, to, started, finished, "sent")
    if isinstance(error, ProviderError):
        kind = (
            "invalid_recipient"
            if isinstance(error, InvalidRecipient)
            else "transient"
            if isinstance(error, TransientProviderError)
            else "permanent"
        )
        return Attempt(
            nid, number, provider, to, started, finished, kind, error.code, error.message, error.http_status
        )
    return Attempt(
        nid, number, provider, to, started, finished, "permanent", type(error).__name__, str(error)
    )


def _contact_name(channel: Channel) -> str:
    return {Channel.email: "email address", Channel.sms: "phone number", Channel.push: "active device"}[
        channel
    ]
