"""Send: one notification to each of its addresses, through the provider chain of its channel.

For each address the channel's provider is called with in-process retries (``RetryPolicy.run``),
behind its circuit breaker; when that provider is unavailable (breaker open) or still failing
transiently, its failover provider (e.g. SMTP for SendGrid) is tried. Every call becomes an
``Attempt`` row, a delivered address a ``SendResult``; what refused is kept in ``Calls`` for
``workers.conclude``. A provider that rejects a push token retires that device.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import asyncpg

from core.render import RenderedContent
from providers.base import Provider, RenderedMessage, SendResult
from providers.errors import (
    InvalidRecipient,
    ProviderError,
    QuotaExceeded,
    TransientProviderError,
)
from providers.registry import NoProviderConfigured, ProviderSet
from schema.enums import Channel
from workers.breaker import Breakers, CircuitOpen
from workers.claim import ClaimedNotification
from workers.conclude import Calls
from workers.outcome import Attempt
from workers.recipients import Address, deactivate_device
from workers.retry import RetryPolicy

log = logging.getLogger(__name__)


@dataclass(kw_only=True, eq=False)
class Sender:
    """Makes the provider calls of one channel's worker."""

    channel: Channel
    pool: asyncpg.Pool
    providers: ProviderSet
    policy: RetryPolicy
    breakers: Breakers | None = None
    unsubscribe_url: Callable[[ClaimedNotification], str | None] | None = None
    # e.g. adaptive pacing slows down on a 429
    on_provider_error: Callable[[ProviderError], None] | None = None
    # what Clarion adds to a push's data (the device's event token)
    push_data: Callable[[ClaimedNotification], dict[str, str]] | None = None

    async def send(
        self,
        notification: ClaimedNotification,
        content: RenderedContent,
        addresses: list[Address],
        calls: Calls,
    ) -> None:
        """Send to every address; ``calls`` collects the attempts, results and refusals (it is the
        caller's, so a call that happened is known even when this raises)."""
        n = notification
        unsubscribe = (
            self.unsubscribe_url(n) if self.unsubscribe_url and self.channel is Channel.email else None
        )
        data: dict[str, Any] = {}
        if self.channel is Channel.push:
            # As the tenant sent them: each adapter writes them as its provider carries them (APNs
            # as JSON values, FCM as text, JSON for what is not). ``str()`` here made both say
            # Python's ``True``, ``None`` and ``{'a': 1}``, which no app's JSON parser reads.
            data = dict(n.data)
            data.update(self.push_data(n) if self.push_data else {})
        for address in addresses:
            message = RenderedMessage(
                notification_id=n.id,
                tenant_id=n.tenant_id,
                channel=self.channel,
                to=address.to,
                body=content.body,
                priority=n.priority,
                category=n.category,
                subject=content.subject,
                html=content.html,
                platform=address.platform,
                data=data,
                expires_at=n.expires_at,
                unsubscribe_url=unsubscribe,
            )
            try:
                provider = self.providers.for_message(self.channel, address.platform)
            except NoProviderConfigured as exc:
                calls.errors.append(ProviderError(str(exc), provider="none", code="no_provider"))
                continue
            chain = [provider]
            secondary = self.providers.failover_for(self.channel, provider)
            if secondary is not None:
                chain.append(secondary)
            try:
                calls.results.append(await self._send_via(chain, message, n, calls))
            except CircuitOpen as exc:
                calls.opened.append(exc)
            except ProviderError as exc:
                calls.errors.append(exc)
                self._report(exc)
                if isinstance(exc, InvalidRecipient) and address.platform is not None:
                    await deactivate_device(
                        pool=self.pool,
                        user_id=n.user_id,
                        token=address.to,
                        reason=f"{exc.provider} {exc.code}: {exc.message}",
                    )

    def _report(self, error: ProviderError) -> None:
        """Tell ``on_provider_error`` (the pacing) of a provider's refusal; a quota refusal the
        provider does not say is whose, as the provider's own once several tenants are refused."""
        if self.on_provider_error is None:
            return
        if isinstance(error, QuotaExceeded) and self.breakers and self.breakers.widespread(error.provider):
            error = TransientProviderError(
                error.message,
                provider=error.provider,
                code=error.code,
                http_status=error.http_status,
                retry_after_s=error.retry_after_s,
            )
        self.on_provider_error(error)

    async def _send_via(
        self, chain: list[Provider], message: RenderedMessage, n: ClaimedNotification, calls: Calls
    ) -> SendResult:
        """Send through the first provider of ``chain`` that delivers; a later one is tried only when
        the one before is unavailable (breaker open) or still failing transiently after its in-process
        attempts. Raises what the last provider raised (``CircuitOpen`` or a ``ProviderError``);
        earlier providers' errors go to ``calls.errors``. Every call becomes an ``Attempt``."""
        attempts = calls.attempts
        for i, provider in enumerate(chain):
            last = i == len(chain) - 1
            board = self.breakers  # disabled, it refuses nothing but still counts quota refusals
            check = partial(board.check, provider.name, n.tenant_id) if board is not None else None
            try:
                result = await self.policy.run(
                    lambda p=provider: p.send(message),  # type: ignore[misc]
                    provider=provider.name,
                    on_attempt=_attempt_recorder(n, message, provider.name, board, attempts),
                    before_attempt=check,
                    budget=self.policy.remaining(n.attempts + len(attempts)),
                )
            except (CircuitOpen, TransientProviderError) as exc:
                if last:
                    raise
                if isinstance(exc, TransientProviderError):
                    calls.errors.append(exc)
                    self._report(exc)
                log.info(
                    "%s unavailable (%s); failing over to %s",
                    provider.name,
                    getattr(exc, "code", None) or type(exc).__name__,
                    chain[i + 1].name,
                    extra={"notification_id": n.id, "event_id": n.event_id, "provider": provider.name},
                )
                continue
            except ProviderError:
                raise
            except Exception as exc:
                _log_unclassified(n, provider.name, exc)
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


def attempt_row(
    n: ClaimedNotification,
    number: int,
    provider: str,
    to: str,
    started: datetime,
    finished: datetime,
    error: BaseException | None,
) -> Attempt:
    """The attempt row of one provider call: ``sent``, or how the error classifies it."""
    row = Attempt(
        notification_id=n.id,
        attempt=number,
        provider=provider,
        recipient=to,
        started_at=started,
        finished_at=finished,
        outcome="sent",
    )
    if error is None:
        return row
    if isinstance(error, ProviderError):
        row.outcome = (
            "invalid_recipient"
            if isinstance(error, InvalidRecipient)
            else "transient"
            if isinstance(error, TransientProviderError)
            else "permanent"
        )
        row.error_code, row.error_message, row.http_status = error.code, error.message, error.http_status
        return row
    row.outcome, row.error_code, row.error_message = "permanent", type(error).__name__, str(error)
    return row


def _attempt_recorder(
    n: ClaimedNotification,
    message: RenderedMessage,
    provider: str,
    board: Breakers | None,
    attempts: list[Attempt],
) -> Callable[[datetime, datetime, BaseException | None], None]:
    """The ``on_attempt`` callback for one provider of the chain: every call becomes an ``Attempt``
    numbered after the notification's earlier ones, and counts on the worker's breakers."""

    def on_attempt(started: datetime, finished: datetime, error: BaseException | None) -> None:
        number = n.attempts + len(attempts) + 1
        attempts.append(attempt_row(n, number, provider, message.to, started, finished, error))
        if board is not None:
            board.record(provider, n.tenant_id, error, to=message.to)

    return on_attempt


def _log_unclassified(n: ClaimedNotification, provider: str, exc: Exception) -> None:
    log.error(  # the class only: its text or traceback may quote the rendered message
        "provider %s raised an unclassified %s",
        provider,
        type(exc).__name__,
        extra={"notification_id": n.id, "event_id": n.event_id, "provider": provider},
        exc_info=exc if log.isEnabledFor(logging.DEBUG) else None,
    )
