"""One notification's exception ends that notification alone (``Pipeline.process``).

The claim and the address lookup (database reads) are replaced by the rows the test claims; every
step between them and the provider is Clarion's own: screens, render, gates, retry policy, the
outcome rules. The end-to-end version runs in tests/e2e/test_isolation.py."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import asyncpg
import pytest

from core.render import RenderedContent, Renderer
from providers.base import RenderedMessage, SendResult
from providers.errors import PermanentProviderError, ProviderError
from providers.registry import ProviderSet
from schema.enums import Channel
from schema.messages import NotificationMessage
from tests.fixtures.claimed import claimed
from tests.fixtures.poison import ExplodingGate
from workers import pipeline as pipeline_module
from workers.claim import ClaimedNotification, Unreadable
from workers.content import Content
from workers.outcome import Outcome
from workers.pipeline import Pipeline
from workers.recipients import Address
from workers.retry import RetryPolicy
from workers.send import Sender


class Recording:
    """A provider that accepts every message, except to addresses in ``refuse``."""

    name = "recording"

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.sent: list[RenderedMessage] = []
        self.refuse = refuse

    async def send(self, message: RenderedMessage) -> SendResult:
        if message.to in self.refuse:
            raise PermanentProviderError("refused", provider=self.name, code="refused")
        self.sent.append(message)
        return SendResult(self.name, f"m-{len(self.sent)}")

    async def aclose(self) -> None:
        return None


class BatchOnlyScreen:
    """Judges whole batches; raises on any batch holding a poisoned row (like a query that one
    row's data breaks); stops nothing otherwise."""

    name = "batch-only"

    async def screen(self, rows: list[ClaimedNotification]) -> dict[UUID, Outcome]:
        if any(r.event_id.startswith("poison") for r in rows):
            raise ValueError("one row broke the batch query")
        return {}


def row(event_id: str, *, channel: Channel = Channel.sms, **changes: Any) -> ClaimedNotification:
    return claimed(event_id=event_id, channel=channel, **changes)


def build(
    monkeypatch: pytest.MonkeyPatch,
    rows: list[ClaimedNotification],
    addresses: dict[UUID, list[Address]],
    *,
    channel: Channel = Channel.sms,
    provider: Recording | None = None,
    on_provider_error: Any = None,
    **steps: Any,
) -> tuple[Pipeline, Recording, list[NotificationMessage]]:
    async def claim(**_: Any) -> tuple[list[ClaimedNotification], list[Unreadable]]:
        return rows, []

    async def addresses_for(**kwargs: Any) -> dict[UUID, list[Address]]:
        return {r.id: addresses[r.id] for r in kwargs["rows"]}

    monkeypatch.setattr(pipeline_module, "claim", claim)
    monkeypatch.setattr(pipeline_module, "addresses_for", addresses_for)
    provider = provider or Recording()
    sender = Sender(
        channel=channel,
        pool=None,  # type: ignore[arg-type]
        providers=ProviderSet(routes={(channel, None): provider}),
        policy=RetryPolicy(),
        on_provider_error=on_provider_error,
    )
    pipeline = Pipeline(
        channel=channel,
        pool=None,  # type: ignore[arg-type]
        content=Content(pool=None, renderer=Renderer()),  # type: ignore[arg-type]
        sender=sender,
        policy=RetryPolicy(),
        lease_s=30.0,
        concurrency=4,
        **steps,
    )
    messages = [
        NotificationMessage(id=r.id, tenant_id="t1", channel=channel, user_id=r.user_id) for r in rows
    ]
    return pipeline, provider, messages


def by_event(rows: list[ClaimedNotification], outcomes: list[Outcome]) -> dict[str, Outcome]:
    events = {r.id: r.event_id for r in rows}
    assert len(outcomes) == len(rows), "every claimed notification has exactly one outcome"
    return {events[o.notification_id]: o for o in outcomes}


async def test_a_gate_raising_for_one_row_fails_that_row_and_the_rest_are_sent_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [row(f"n-{i}") for i in range(20)] + [row("poison-1")]
    addresses = {r.id: [Address(f"+1415555{i:04d}")] for i, r in enumerate(rows)}
    pipeline, provider, messages = build(monkeypatch, rows, addresses, gates=[ExplodingGate()])
    outcomes = by_event(rows, await pipeline.process(messages))
    poison = outcomes.pop("poison-1")
    assert (poison.status, poison.error_code, poison.calls) == ("failed", "internal_error", 0)
    assert poison.error_message is not None and "UnicodeEncodeError" in poison.error_message
    assert [(a.provider, a.error_code, a.error_message) for a in poison.attempts] == [
        ("none", "internal_error", "UnicodeEncodeError")
    ]
    assert {o.status for o in outcomes.values()} == {"sent"}
    assert sorted(m.to for m in provider.sent) == sorted(
        a[0].to for r, a in addresses.items() if r != rows[-1].id
    )


async def test_a_screen_raising_on_the_batch_is_asked_row_by_row_so_only_the_bad_row_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [row("n-1"), row("poison-1"), row("n-2")]
    addresses = {r.id: [Address(f"+1415555000{i}")] for i, r in enumerate(rows)}
    pipeline, provider, messages = build(monkeypatch, rows, addresses, screens=[BatchOnlyScreen()])
    outcomes = by_event(rows, await pipeline.process(messages))
    assert (outcomes["poison-1"].status, outcomes["poison-1"].error_code) == ("failed", "internal_error")
    assert outcomes["poison-1"].attempts[-1].error_message == "ValueError"
    assert (outcomes["n-1"].status, outcomes["n-2"].status) == ("sent", "sent")
    assert len(provider.sent) == 2


async def test_an_exception_after_a_provider_accepted_still_records_the_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first device is sent to; the second's refusal reaches a hook that raises. The call that
    happened is recorded (``sent``, its attempt row), never dropped to be made again."""

    def broken_hook(error: ProviderError) -> None:
        raise RuntimeError("the pacing hook broke")

    target = row("n-1", channel=Channel.push)
    addresses = {target.id: [Address("tok-ok", "fcm"), Address("tok-bad", "fcm")]}
    pipeline, provider, messages = build(
        monkeypatch,
        [target],
        addresses,
        channel=Channel.push,
        provider=Recording(refuse=frozenset({"tok-bad"})),
        on_provider_error=broken_hook,
    )
    [outcome] = await pipeline.process(messages)
    assert (outcome.status, outcome.provider, outcome.provider_message_id) == ("sent", "recording", "m-1")
    assert [(a.recipient, a.outcome) for a in outcome.attempts] == [
        ("tok-ok", "sent"),
        ("tok-bad", "permanent"),
    ]
    assert [m.to for m in provider.sent] == ["tok-ok"]


async def test_a_row_claimed_more_than_max_claims_times_goes_dead_without_a_send(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tired, fresh = row("n-tired", claims=4), row("n-fresh")
    addresses = {tired.id: [Address("+14155550001")], fresh.id: [Address("+14155550002")]}
    pipeline, provider, messages = build(monkeypatch, [tired, fresh], addresses, max_claims=3)
    outcomes = by_event([tired, fresh], await pipeline.process(messages))
    assert (outcomes["n-tired"].status, outcomes["n-tired"].error_code) == ("dead", "max_claims")
    assert outcomes["n-fresh"].status == "sent"
    assert [m.to for m in provider.sent] == ["+14155550002"]


class FlakyGate:
    """The database away for a moment: raises ``fault`` for every row."""

    name = "flaky"

    def __init__(self, fault: Exception) -> None:
        self.fault = fault

    async def admit(
        self, row: ClaimedNotification, content: RenderedContent, addresses: list[Address]
    ) -> Outcome | None:
        raise self.fault


FAULTS = [
    ConnectionResetError("connection reset by peer"),
    asyncpg.CannotConnectNowError("the database system is starting up"),  # a restart (chaos 3)
    asyncpg.AdminShutdownError("terminating connection due to administrator command"),
]


@pytest.mark.parametrize("fault", FAULTS, ids=lambda f: type(f).__name__)
@pytest.mark.parametrize(
    ("attempts_before", "status"), [(0, "retrying"), (RetryPolicy().max_attempts - 1, "dead")]
)
async def test_an_infrastructure_fault_is_retried_within_the_attempt_budget_not_failed(
    monkeypatch: pytest.MonkeyPatch, attempts_before: int, status: str, fault: Exception
) -> None:
    target = row("n-1", attempts=attempts_before)
    pipeline, provider, messages = build(
        monkeypatch, [target], {target.id: [Address("+14155550001")]}, gates=[FlakyGate(fault)]
    )
    [outcome] = await pipeline.process(messages)
    assert (outcome.status, outcome.error_code, outcome.calls) == (status, "internal_error", 1)
    assert (outcome.not_before is not None) == (status == "retrying")
    assert [(a.outcome, a.error_message) for a in outcome.attempts] == [("transient", type(fault).__name__)]
    assert provider.sent == []
