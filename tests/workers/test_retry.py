"""The retry policy against a real provider adapter and its local fake: what is retried, how long
it waits, what it never retries, and the schedule after the in-process attempts."""

from __future__ import annotations

import itertools
import random
import statistics
from datetime import datetime

import pytest

from clarion.retry_settings import RetrySettings
from harness.fakes import make_message
from harness.fakes.twilio import FakeTwilio
from providers.errors import InvalidRecipient, PermanentProviderError, TransientProviderError
from providers.twilio import TwilioProvider
from schema.enums import Channel
from tests.fixtures.provider_fakes import adapter_for, running_fake
from tests.fixtures.provider_settings import twilio_settings
from workers.retry import RetryPolicy

fake = running_fake(FakeTwilio)


provider = adapter_for(lambda fake: TwilioProvider(twilio_settings(fake, timeout_s=2)))


def gaps_s(fake: FakeTwilio) -> list[float]:
    at = [r.at_s for r in fake.requests]
    return [b - a for a, b in itertools.pairwise(at)]


async def test_two_server_errors_then_success_is_sent_on_the_third_call_with_jittered_waits(
    fake: FakeTwilio, provider: TwilioProvider
) -> None:
    policy = RetryPolicy(in_process_attempts=3, base_s=0.1, max_wait_s=0.5)
    first: list[float] = []
    second: list[float] = []
    # Seeded: six full-jitter waits drawn from U(0, 0.1 s) have a standard deviation under 10 ms
    # about one run in 110 (the CI run of d517744 drew 68-82 ms six times); these draws are
    # 6-93 ms. Without jitter every draw would be the same, whatever the seed.
    random.seed(20261128)
    for _ in range(6):
        fake.reset()
        fake.force_server_error(2, status=500)
        outcomes: list[BaseException | None] = []

        def seen(
            started: datetime,
            finished: datetime,
            error: BaseException | None,
            outcomes: list[BaseException | None] = outcomes,
        ) -> None:
            outcomes.append(error)

        result = await policy.run(
            lambda: provider.send(make_message(Channel.sms)), provider="twilio", on_attempt=seen
        )
        assert result.provider == "twilio"
        assert len(fake.requests) == 3
        assert [type(e) for e in outcomes] == [TransientProviderError, TransientProviderError, type(None)]
        gap1, gap2 = gaps_s(fake)
        first.append(gap1)
        second.append(gap2)
    random.seed()  # back to the system's entropy for the tests after this one
    assert all(w <= 0.5 + 0.1 for w in first + second)
    # Full jitter: the same retry waits a different time for each notification.
    assert statistics.pstdev(first) > 0.01, first
    assert statistics.pstdev(second) > 0.01, second


def asks_to_wait_once(fake: FakeTwilio, *, retry_after_s: int) -> None:
    """The next call is refused 429 with ``Retry-After`` (not Twilio's behaviour, which sends
    none: this tests the policy's handling of the hint)."""
    fake.retry_after_hint = True
    fake.force_rate_limit(1, retry_after_s=retry_after_s)


async def test_retry_after_within_the_cap_is_waited_in_process(
    fake: FakeTwilio, provider: TwilioProvider
) -> None:
    asks_to_wait_once(fake, retry_after_s=2)
    policy = RetryPolicy(in_process_attempts=3, base_s=0.01, max_wait_s=3)

    await policy.run(lambda: provider.send(make_message(Channel.sms)), provider="twilio")

    assert len(fake.requests) == 2
    assert gaps_s(fake)[0] >= 2.0


async def test_retry_after_beyond_the_cap_ends_the_in_process_attempts_at_once(
    fake: FakeTwilio, provider: TwilioProvider
) -> None:
    asks_to_wait_once(fake, retry_after_s=30)
    policy = RetryPolicy(in_process_attempts=3, base_s=0.01, max_wait_s=1)

    with pytest.raises(TransientProviderError) as caught:
        await policy.run(lambda: provider.send(make_message(Channel.sms)), provider="twilio")

    assert caught.value.retry_after_s == 30
    assert len(fake.requests) == 1
    assert policy.next_delay_s(1, caught.value.retry_after_s) >= 30


@pytest.mark.parametrize("code", [21211, 21602])
async def test_permanent_errors_and_invalid_recipients_are_never_retried(
    fake: FakeTwilio, provider: TwilioProvider, code: int
) -> None:
    fake.fail_number("+14155550100", code)
    policy = RetryPolicy(in_process_attempts=3, base_s=0.01)

    with pytest.raises(PermanentProviderError) as caught:
        await policy.run(lambda: provider.send(make_message(Channel.sms)), provider="twilio")

    assert isinstance(caught.value, InvalidRecipient) == (code == 21211)
    assert len(fake.requests) == 1


async def test_a_hanging_call_times_out_as_transient_and_is_retried(
    fake: FakeTwilio, provider: TwilioProvider
) -> None:
    fake.force_timeout(1, delay_s=1.0)
    policy = RetryPolicy(in_process_attempts=2, base_s=0.01, attempt_timeout_s=0.2)

    result = await policy.run(lambda: provider.send(make_message(Channel.sms)), provider="twilio")

    assert result.provider == "twilio"
    assert len(fake.requests) == 2


async def test_the_attempt_budget_caps_in_process_calls(fake: FakeTwilio, provider: TwilioProvider) -> None:
    fake.force_server_error(5)
    policy = RetryPolicy(in_process_attempts=3, base_s=0.01)

    with pytest.raises(TransientProviderError):
        await policy.run(lambda: provider.send(make_message(Channel.sms)), provider="twilio", budget=1)

    assert len(fake.requests) == 1


def test_scheduled_retries_grow_exponentially_with_jitter_up_to_the_cap() -> None:
    policy = RetryPolicy(retry_base_s=2, retry_max_s=900)
    for attempts, ceiling in [(1, 2), (3, 8), (6, 64), (20, 900)]:
        delays = [policy.next_delay_s(attempts) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), (attempts, delays)
        assert len(set(delays)) > 1
    assert policy.exhausted(8) and not policy.exhausted(7)


def test_max_attempts_are_configurable_per_channel() -> None:
    settings = RetrySettings(max_attempts=8, max_attempts_sms=3)
    assert RetryPolicy.of(settings, Channel.sms).max_attempts == 3
    assert RetryPolicy.of(settings, Channel.email).max_attempts == 8


def test_per_channel_max_attempts_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from clarion.settings import Settings

    monkeypatch.setenv("CLARION_RETRY__MAX_ATTEMPTS_EMAIL", "5")
    monkeypatch.setenv("CLARION_RETRY__BREAKER__COOL_DOWN_S", "12")
    settings = Settings(env="test")
    assert RetryPolicy.of(settings.retry, Channel.email).max_attempts == 5
    assert settings.retry.breaker.cool_down_s == 12
