"""The retry policy: the only module that imports tenacity.

Two tiers. In-process: up to ``in_process_attempts`` calls with exponential backoff and full jitter
(``wait_random_exponential``), honouring a provider's ``retry_after`` up to ``max_wait_s``, each
call bounded by ``attempt_timeout_s``. A provider asking for a longer pause than ``max_wait_s``
ends the in-process tier at once rather than holding a worker slot.

After that the notification is rescheduled: status ``retrying`` with ``not_before`` from
``next_delay_s`` (exponential in the attempt count with jitter: seconds, then minutes, capped at
``retry_max_s``, never before the provider's hint). The worker publishes it to
``notifications.<channel>.retry`` and the retry lane delivers it when due (``workers.app``). The
attempt count lives in the log, so a restarted worker resumes the schedule where it was. After
``max_attempts`` provider calls (per channel) it is ``dead``; a retry that would fall after the
notification's ``expires_at`` makes it ``expired`` instead.

Only ``TransientProviderError`` is retried; ``PermanentProviderError`` and ``InvalidRecipient``
end the notification at once.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt
from tenacity.stop import stop_base
from tenacity.wait import wait_base, wait_random_exponential

from clarion.retry_settings import RetrySettings
from providers.errors import TransientProviderError
from schema.enums import Channel

T = TypeVar("T")
AttemptHook = Callable[[datetime, datetime, BaseException | None], None]


class _WaitRetryAfter(wait_base):
    """Wait what the provider asked for when it said; otherwise exponential backoff, full jitter."""

    def __init__(self, fallback: wait_base, cap_s: float) -> None:
        self.fallback = fallback
        self.cap_s = cap_s

    def __call__(self, retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        hint = getattr(exc, "retry_after_s", None)
        if hint is not None:
            return float(min(max(hint, 0.0), self.cap_s))
        return float(self.fallback(retry_state))


class _RetryAfterTooLong(stop_base):
    """Stop in-process retries when the provider asks for a longer pause than we hold a slot for."""

    def __init__(self, cap_s: float) -> None:
        self.cap_s = cap_s

    def __call__(self, retry_state: RetryCallState) -> bool:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        hint = getattr(exc, "retry_after_s", None)
        return hint is not None and hint > self.cap_s


@dataclass(frozen=True)
class RetryPolicy:
    in_process_attempts: int = 3
    base_s: float = 0.05
    max_wait_s: float = 2.0
    attempt_timeout_s: float = 10.0
    max_attempts: int = 8
    retry_base_s: float = 2.0
    retry_max_s: float = 900.0

    @classmethod
    def of(cls, settings: RetrySettings, channel: Channel) -> RetryPolicy:
        """The policy a ``channel`` worker uses."""
        return cls(
            in_process_attempts=settings.in_process_attempts,
            base_s=settings.base_s,
            max_wait_s=settings.max_wait_s,
            attempt_timeout_s=settings.attempt_timeout_s,
            max_attempts=settings.max_attempts_for(channel),
            retry_base_s=settings.retry_base_s,
            retry_max_s=settings.retry_max_s,
        )

    async def run(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        provider: str,
        on_attempt: AttemptHook | None = None,
        before_attempt: Callable[[], None] | None = None,
        budget: int | None = None,
    ) -> T:
        """Call until it succeeds, raises a non-transient error, or the in-process budget is spent.

        Raises the last error then. At most ``min(in_process_attempts, budget)`` calls (at least
        one). A call that exceeds ``attempt_timeout_s`` counts as a transient failure (code
        ``timeout``). ``before_attempt()`` runs before every call and may raise to stop without
        calling (the circuit breaker); ``on_attempt(started, finished, error)`` sees every call.
        """
        attempts = max(1, min(self.in_process_attempts, budget if budget is not None else 1 << 30))
        # The first call needs no retry machinery: building tenacity's AsyncRetrying and entering
        # its first attempt costs ~30 us against ~0.1 us for a plain await (timeit, 2026-11-25),
        # more than a sandbox send. Only after a transient failure does tenacity take over; the
        # failure already made is replayed as its attempt 1 (``raise made.pop()``), so its stop and
        # wait rules count it like any other.
        if before_attempt is not None:
            before_attempt()
        try:
            return await self._bounded(call, provider, on_attempt)
        except TransientProviderError as exc:
            made: list[TransientProviderError] = [exc]
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TransientProviderError),
            stop=stop_after_attempt(attempts) | _RetryAfterTooLong(self.max_wait_s),
            wait=_WaitRetryAfter(
                wait_random_exponential(multiplier=self.base_s, max=self.max_wait_s), self.max_wait_s
            ),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                if made:  # attempt 1, already made above
                    raise made.pop()
                if before_attempt is not None:
                    before_attempt()
                return await self._bounded(call, provider, on_attempt)
        raise AssertionError("unreachable: tenacity either returns or reraises")

    async def _bounded(
        self, call: Callable[[], Awaitable[T]], provider: str, on_attempt: AttemptHook | None
    ) -> T:
        started = datetime.now(UTC)
        error: BaseException | None = None
        try:
            # asyncio.timeout, not wait_for: wait_for runs the call in a task of its own (~3% of a
            # worker's CPU under bench.e2e with the sandbox provider, py-spy 2026-11-28).
            async with asyncio.timeout(self.attempt_timeout_s):
                return await call()
        except TimeoutError:
            error = TransientProviderError(
                f"provider call exceeded {self.attempt_timeout_s}s", provider=provider, code="timeout"
            )
            raise error from None
        except BaseException as exc:  # cancellation too: the hook must see every call end
            error = exc
            raise
        finally:
            if on_attempt is not None:
                on_attempt(started, datetime.now(UTC), error)

    def next_delay_s(self, attempts: int, retry_after_s: float | None = None) -> float:
        """Delay before the next scheduled try after ``attempts`` calls: exponential with jitter
        (between half and all of ``retry_base_s * 2**(attempts-1)``, capped at ``retry_max_s``),
        never shorter than the provider's ``retry_after_s`` (itself capped at ``retry_max_s``)."""
        ceiling = min(self.retry_max_s, self.retry_base_s * (2 ** min(max(attempts - 1, 0), 40)))
        delay = random.uniform(ceiling / 2, ceiling)
        return max(delay, min(retry_after_s or 0.0, self.retry_max_s))

    def exhausted(self, attempts: int) -> bool:
        """True once ``attempts`` provider calls are all this notification gets."""
        return attempts >= self.max_attempts

    def remaining(self, attempts: int) -> int:
        """Provider calls still allowed after ``attempts``."""
        return max(self.max_attempts - attempts, 0)
