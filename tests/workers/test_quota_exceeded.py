"""FCM's ``429 QUOTA_EXCEEDED`` does not say whose quota ran out: the project's, one device's (240 a
minute) or one topic's. The worker charges it to the tenant whose push it was, on that tenant's own
breaker: a tenant flooding one of its devices stops only itself, and a quota every tenant runs into
still stops each of them. Pushes go through the real FCM adapter to the local fake.

Before: one tenant's ten pushes to one device, each answered ``QUOTA_EXCEEDED``, opened the
worker's shared FCM breaker and halved its pacing; another tenant's 20 pushes were still
``retrying`` 121 s later (the end-to-end probe of session 17), where they took 0.2 s alone."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from clarion.retry_settings import BreakerSettings
from core.render import RenderedContent
from harness.fakes.fcm import FakeFcm
from providers.fcm import FcmProvider
from providers.registry import ProviderSet
from schema.enums import Channel, Status
from tests.fixtures import pushes
from tests.fixtures.claimed import claimed
from tests.fixtures.provider_settings import fcm_settings
from workers.breaker import Breakers
from workers.conclude import Calls, conclude
from workers.recipients import Address
from workers.retry import RetryPolicy
from workers.send import Sender
from workers.throttle import AdaptivePacing

BUSY = "busy-device"  # one tenant's device, pushed to past FCM's per-device quota
MIN_CALLS = 10


@pytest.fixture
async def fcm() -> AsyncIterator[tuple[FakeFcm, Sender, AdaptivePacing]]:
    async with FakeFcm(device_quota_per_minute=2) as fake:
        provider = FcmProvider(fcm_settings(fake))
        pacing = AdaptivePacing(clock=lambda: 0.0)  # a second passes in no test: one halving a burst
        yield (
            fake,
            Sender(
                channel=Channel.push,
                pool=None,  # type: ignore[arg-type]  # used only to retire a dead device
                providers=ProviderSet(routes={(Channel.push, "fcm"): provider}),
                policy=RetryPolicy(base_s=0.001, max_wait_s=0.001),
                breakers=Breakers(BreakerSettings(min_calls=MIN_CALLS, failure_rate=0.5, cool_down_s=30)),
                on_provider_error=pacing.on_provider_error,
            ),
            pacing,
        )
        await provider.aclose()


push = partial(pushes.push, platform="fcm")


async def test_one_tenants_flood_to_its_device_stops_that_tenant_and_no_other(
    fcm: tuple[FakeFcm, Sender, AdaptivePacing],
) -> None:
    fake, s, pacing = fcm
    refused = [await push(s, "tenant-b", BUSY) for _ in range(14)]

    assert [len(c.results) for c in refused[:2]] == [1, 1]  # FCM's quota: 2 a minute (here)
    assert [e.code for e in refused[2].errors] == ["QUOTA_EXCEEDED"]
    # one refused call a push (the next try is a minute away), and the 10th opens tenant-b's breaker
    assert [len(c.attempts) for c in refused[2:12]] == [1] * 10
    assert [bool(c.opened) for c in refused] == [False] * 12 + [True] * 2
    assert s.breakers is not None and s.breakers.snapshot() == {"fcm": "closed"}
    assert pacing.factor("fcm") == 1.0

    others = [await push(s, "tenant-a", f"device-{i}") for i in range(20)]
    own_other_device = await push(s, "tenant-b", "another-device")

    assert all(c.opened == [] and len(c.results) == 1 for c in others)
    assert [t["token"] for t in fake.delivered].count(BUSY) == 2
    assert len(own_other_device.opened) == 1 and own_other_device.results == []


async def test_a_quota_every_tenant_runs_into_stops_every_tenant_and_slows_the_pace(
    fcm: tuple[FakeFcm, Sender, AdaptivePacing],
) -> None:
    """Three tenants refused within the breaker's window make it the project's quota: before, 200
    tenants each sending fewer than ``min_calls`` pushes a window were never stopped (1,800 calls
    a window, the pace unchanged; a review's measurement)."""
    fake, s, pacing = fcm
    fake.force_rate_limit(1000, retry_after_s=60)  # the project's quota: every push refused
    tenants = [f"t-{i}" for i in range(40)]

    results = [await push(s, t, f"{t}-device-{i}") for i in range(3) for t in tenants]

    # t-0, t-1 and t-2 refused: then the provider's breaker counts them, opening at its 10th
    assert len(fake.sent("messages:send")) == MIN_CALLS + 2
    assert all(c.opened for c in results[MIN_CALLS + 2 :])
    assert s.breakers is not None and s.breakers.snapshot() == {"fcm": "open"}
    assert pacing.factor("fcm") == 0.5


async def test_the_projects_quota_named_as_such_slows_the_pace_at_its_first_refusal(
    fcm: tuple[FakeFcm, Sender, AdaptivePacing],
) -> None:
    """When FCM names the quota as the project's, no three tenants need to run into it first."""
    fake, s, pacing = fcm
    fake.use_up_project_quota(MIN_CALLS)

    refused = [await push(s, "tenant-a", f"device-{i}") for i in range(MIN_CALLS)]

    assert all([e.code for e in c.errors] == ["RESOURCE_EXHAUSTED"] for c in refused)
    assert pacing.factor("fcm") == 0.5
    assert s.breakers is not None and s.breakers.snapshot() == {"fcm": "open"}


async def test_a_tenants_quota_refusal_answering_the_providers_probe_leaves_fcm_to_every_tenant(
    fcm: tuple[FakeFcm, Sender, AdaptivePacing],
) -> None:
    """Before: the refusal was counted on no breaker, so the provider's stayed half-open with its
    probe in flight for ever, and every tenant's push was refused by this worker from then on."""
    fake, s, _ = fcm
    now = [1000.0]
    s.breakers = Breakers(
        BreakerSettings(min_calls=MIN_CALLS, failure_rate=0.5, cool_down_s=30), clock=lambda: now[0]
    )
    fake.force_server_error(MIN_CALLS)  # an FCM outage opens the provider's breaker
    outage = [await push(s, "tenant-a", f"device-{i}") for i in range(4)]
    assert bool(outage[-1].opened) and s.breakers.snapshot() == {"fcm": "open"}

    now[0] += 30  # FCM is back; tenant-b's push to its flooded device is the probe
    fake.use_up_device_quota(BUSY)
    flood = await push(s, "tenant-b", BUSY)
    now[0] += 1
    after = await push(s, "tenant-a", "device-after")

    assert [e.code for e in flood.errors] == ["QUOTA_EXCEEDED"]
    assert after.opened == [] and len(after.results) == 1
    assert s.breakers.snapshot() == {"fcm": "closed"}


async def test_a_push_past_its_devices_quota_is_tried_again_after_a_minute_not_at_once(
    fcm: tuple[FakeFcm, Sender, AdaptivePacing],
) -> None:
    """FCM's ErrorCode reference asks for a minute before retrying its project's or a topic's
    quota, and a device's is counted per minute. Before: two more calls within milliseconds, both
    refused and both spending the notification's attempts, then a try again within 8 s."""
    fake, s, _ = fcm
    fake.use_up_device_quota(BUSY)
    n = claimed(channel=Channel.push, tenant_id="tenant-b", id=uuid.uuid4())
    calls = Calls()
    await s.send(
        n, RenderedContent(subject="hi", body="hello", html=None), [Address(BUSY, platform="fcm")], calls
    )
    now = datetime.now(UTC)

    outcome = conclude(notification=n, calls=calls, policy=s.policy, now=now)

    assert (outcome.status, outcome.calls, outcome.error_code) == (Status.retrying, 1, "QUOTA_EXCEEDED")
    assert outcome.not_before is not None and outcome.not_before >= now + timedelta(seconds=60)


async def test_one_tenants_flood_to_a_phone_other_tenants_push_to_stops_no_one_else(
    fcm: tuple[FakeFcm, Sender, AdaptivePacing],
) -> None:
    """Tenants are internal services pushing to the same users' phones, so a phone one tenant
    floods refuses the others' pushes as well. Before: the third tenant refused on it made the
    quota the project's, the flooder's refusals opened the shared breaker and halved the pace, and
    tenant-a's pushes to phones no one floods were all refused."""
    fake, s, pacing = fcm
    flood = [await push(s, "tenant-x", BUSY) for _ in range(3)]
    others = [await push(s, tenant, BUSY) for tenant in ("tenant-y", "tenant-z")]
    flood += [await push(s, "tenant-x", BUSY) for _ in range(12)]

    theirs = [await push(s, "tenant-a", f"device-{i}") for i in range(20)]

    assert [t["token"] for t in fake.delivered].count(BUSY) == 2  # FCM's quota: 2 a minute (here)
    assert [e.code for c in others for e in c.errors] == ["QUOTA_EXCEEDED"] * 2
    assert bool(flood[-1].opened)  # tenant-x's own breaker stopped it
    assert all(c.opened == [] and len(c.results) == 1 for c in theirs)
    assert s.breakers is not None and s.breakers.snapshot() == {"fcm": "closed"}
    assert pacing.factor("fcm") == 1.0


async def test_with_breakers_disabled_a_quota_every_tenant_runs_into_still_slows_the_pace(
    fcm: tuple[FakeFcm, Sender, AdaptivePacing],
) -> None:
    fake, s, pacing = fcm
    s.breakers = Breakers(BreakerSettings(enabled=False))
    fake.force_rate_limit(1000, retry_after_s=60)

    results = [await push(s, f"t-{i}", f"t-{i}-device") for i in range(5)]

    assert all(c.opened == [] and [e.code for e in c.errors] == ["QUOTA_EXCEEDED"] for c in results)
    assert pacing.factor("fcm") == 0.5
