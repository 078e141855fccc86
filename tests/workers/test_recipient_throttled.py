"""A provider refusing more for one recipient (APNs ``429 TooManyRequests``: too many pushes to one
device token) is that tenant's problem alone: it opens no breaker and slows no pacing that every
tenant's sends share.

Before: ten pushes of one tenant to its own device, each answered 429 TooManyRequests three times
in process, opened the worker's APNs breaker; another tenant's 20 pushes then waited in
``retrying`` for over 120 s (the end-to-end probe's window; each half-open probe could be one of
the first tenant's rescheduled pushes, failing again), where they took 0.22 s alone."""

from __future__ import annotations

from functools import partial

from clarion.retry_settings import BreakerSettings
from providers.base import RenderedMessage, SendResult
from providers.errors import RecipientThrottled
from providers.registry import ProviderSet
from schema.enums import Channel
from tests.fixtures import pushes
from workers.breaker import Breakers
from workers.retry import RetryPolicy
from workers.send import Sender
from workers.throttle import AdaptivePacing

BUSY_DEVICE = "b" * 64  # the device the provider takes no more pushes for, for now


class OneDeviceBusy:
    """APNs as it answers a flood to one device token: 429 TooManyRequests for that token only."""

    name = "apns-like"

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send(self, message: RenderedMessage) -> SendResult:
        if message.to == BUSY_DEVICE:
            raise RecipientThrottled(
                "APNs refused the push: 429 TooManyRequests",
                provider=self.name,
                code="TooManyRequests",
                http_status=429,
            )
        self.sent.append(message.to)
        return SendResult(self.name, f"m-{len(self.sent)}")

    async def aclose(self) -> None:
        return None


def sender(provider: OneDeviceBusy, **hooks: object) -> Sender:
    return Sender(
        channel=Channel.push,
        pool=None,  # type: ignore[arg-type]  # used only to retire a dead device
        providers=ProviderSet(routes={(Channel.push, "apns"): provider}),
        policy=RetryPolicy(base_s=0.001, max_wait_s=0.001),
        breakers=Breakers(BreakerSettings(min_calls=10, failure_rate=0.5, cool_down_s=30)),
        **hooks,  # type: ignore[arg-type]
    )


push = partial(pushes.push, platform="apns")


async def test_one_tenants_pushes_to_a_throttled_device_leave_the_breaker_closed_for_another() -> None:
    provider = OneDeviceBusy()
    s = sender(provider)
    for _ in range(10):  # 30 calls, every one refused for that device
        refused = await push(s, "tenant-b", BUSY_DEVICE)
        assert [e.code for e in refused.errors] == ["TooManyRequests"]
    assert s.breakers is not None
    assert s.breakers.snapshot() == {"apns-like": "closed"}

    other = await push(s, "tenant-a", "a" * 64)

    assert other.opened == [] and [r.provider_message_id for r in other.results] == ["m-1"]


async def test_one_tenants_pushes_to_a_throttled_device_do_not_slow_the_providers_pacing() -> None:
    pacing = AdaptivePacing()
    s = sender(OneDeviceBusy(), on_provider_error=pacing.on_provider_error)

    await push(s, "tenant-b", BUSY_DEVICE)

    assert pacing.factor("apns-like") == 1.0
