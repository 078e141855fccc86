"""The retry policy: the only module that imports tenacity.

Two tiers. In-process: a few attempts with exponential backoff and full jitter, honouring a
provider's ``retry_after`` up to ``max_wait_s``, each attempt bounded by ``attempt_timeout_s``.
After that the notification is rescheduled (status ``retrying``, ``not_before`` from
``next_delay_s``) and picked up again later; after ``max_attempts`` provider calls it is dead.
Only ``TransientProviderError`` is retried.
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

from providers.errors import TransientProviderError

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

    async def run(
        self, call: Callable[[], Awaitable[T]], *, provider: str, on_attempt: AttemptHook | None = None
    ) -> T:
        """Call until it succeeds, raises a non-transient error, or the in-process budget is spent.

        Raises the last error then. A call that exceeds ``attempt_timeout_s`` counts as a
        transient failure (code ``timeout``). ``on_attempt(started, finished, error)`` sees every call.
        """
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(TransientProviderError),
            stop=stop_after_attempt(self.in_process_attempts) | _RetryAfterTooLong(self.max_wait_s),
            wait=_WaitRetryAfter(
                wait_random_exponential(multiplier=self.base_s, max=self.max_wait_s), self.max_wait_s
            ),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._bounded(call, provider, on_attempt)
        raise AssertionError("unreachable: tenacity either returns or reraises")

    async def _bounded(
        self, call: Callable[[], Awaitable[T]], provider: str, on_attempt: AttemptHook | None
    ) -> T:
        started = datetime.now(UTC)
        error: BaseException | None = None
        try:
            return await asyncio.wait_for(call(), self.attempt_timeout_s)
        except TimeoutError:
            error = TransientProviderError(
                f"provider call exceeded {self.attempt_timeout_s}s", provider=provider, code="timeout"
            )
            raise error from None
        except Exception as exc:
            error = exc
            raise
        finally:
            if on_attempt is not None:
                on_attempt(started, datetime.now(UTC), error)

    def next_delay_s(self, attempts: int, retry_after_s: float | None = None) -> float:
        """Delay before the next scheduled try after ``attempts`` calls: exponential, full jitter,
        never shorter than the provider's ``retry_after_s``."""
        ceiling = min(self.retry_max_s, self.retry_base_s * (2 ** max(attempts - 1, 0)))
        delay = random.uniform(ceiling / 2, ceiling)
        return max(delay, retry_after_s or 0.0)

    def exhausted(self, attempts: int) -> bool:
        return attempts >= self.max_attempts
