"""A push's data reaches each provider as the tenant sent it, through the worker's own ``Sender``:
JSON values in the APNs payload, JSON text in FCM's string map.

Before: the sender turned every value into Python's ``str()`` before either adapter saw it, so
``true``, ``null`` and ``{"a": [1, null]}`` arrived at both providers as ``"True"``, ``"None"`` and
``"{'a': [1, None]}"`` (an end-to-end probe, 2026-11-28), which no app's JSON parser reads; the FCM
adapter's own JSON encoding of non-text values (its test calls the adapter directly) never ran."""

from __future__ import annotations

import uuid

from core.render import RenderedContent
from harness.fakes.apns import FakeApns
from harness.fakes.fcm import FakeFcm
from providers.apns import ApnsProvider
from providers.fcm import FcmProvider
from providers.registry import ProviderSet
from schema.enums import Channel
from tests.fixtures.claimed import claimed
from tests.fixtures.provider_settings import apns_settings, fcm_settings
from workers.conclude import Calls
from workers.recipients import Address
from workers.retry import RetryPolicy
from workers.send import Sender

DATA = {"text": "x", "n": 3, "yes": True, "none": None, "nested": {"a": [1, None]}}
APNS_DEVICE, FCM_DEVICE = "ab" * 32, "fcm-" + "c" * 40


async def test_push_data_reaches_apns_as_json_values_and_fcm_as_json_text() -> None:
    async with FakeApns() as apns_fake, FakeFcm() as fcm_fake:
        apns, fcm = ApnsProvider(apns_settings(apns_fake)), FcmProvider(fcm_settings(fcm_fake))
        sender = Sender(
            channel=Channel.push,
            pool=None,  # type: ignore[arg-type]  # used only to retire a dead device
            providers=ProviderSet(routes={(Channel.push, "apns"): apns, (Channel.push, "fcm"): fcm}),
            policy=RetryPolicy(),
        )
        calls = Calls()
        try:
            await sender.send(
                claimed(channel=Channel.push, id=uuid.uuid4(), data=DATA),
                RenderedContent(subject="hi", body="hello", html=None),
                [Address(APNS_DEVICE, platform="apns"), Address(FCM_DEVICE, platform="fcm")],
                calls,
            )
        finally:
            await apns.aclose()
            await fcm.aclose()
    assert [r.provider for r in calls.results] == ["apns", "fcm"], calls.errors
    [pushed] = apns_fake.sent(APNS_DEVICE)
    assert {k: pushed.body[k] for k in DATA} == DATA
    [sent] = fcm_fake.sent("messages:send")
    assert {k: sent.body["message"]["data"][k] for k in DATA} == {
        "text": "x", "n": "3", "yes": "true", "none": "null", "nested": '{"a":[1,null]}'
    }  # fmt: skip
