"""Every push carries its event token in its data, and the strict APNs and FCM fakes (which refuse
what the real services refuse, reserved FCM keys included) accept a push carrying it."""

from __future__ import annotations

import json

from clarion.engagement_tokens import PUSH_DATA_KEY, verify_engagement_token
from harness.fakes import make_message
from harness.fakes.apns import FakeApns
from harness.fakes.fcm import FakeFcm
from providers.apns import ApnsProvider
from providers.fcm import FcmProvider, reserved_data_key
from providers.settings import ApnsSettings, FcmSettings
from schema.enums import Channel
from tests.fixtures.claimed import claimed
from workers.engagement_token import PushEventToken

SIGNER = PushEventToken(secret="worker-secret", ttl_s=3600)


def test_the_token_names_the_notification_and_its_key_is_not_reserved_by_fcm() -> None:
    n = claimed(channel="push")
    data = SIGNER.data(n)
    assert list(data) == [PUSH_DATA_KEY] and not reserved_data_key(PUSH_DATA_KEY)
    claims = verify_engagement_token(data[PUSH_DATA_KEY], secrets=["worker-secret"])
    assert (claims.tenant_id, claims.notification_id) == (n.tenant_id, n.id)


async def test_an_fcm_push_carrying_the_token_is_accepted_by_the_strict_fake() -> None:
    n = claimed(channel="push")
    async with FakeFcm() as fake:
        settings = FcmSettings.model_validate(
            {"service_account_json": json.dumps(fake.service_account_info()), "base_url": fake.url}
        )
        provider = FcmProvider(settings)
        try:
            data = {"order": "42", **SIGNER.data(n)}
            await provider.send(make_message(Channel.push, to="tok", platform="fcm", data=data))
        finally:
            await provider.aclose()
    assert fake.delivered[0]["data"] == data


async def test_an_apns_push_carrying_the_token_is_accepted_by_the_strict_fake() -> None:
    n = claimed(channel="push")
    async with FakeApns() as fake:
        settings = ApnsSettings.model_validate(
            {
                "key_id": fake.key_id,
                "team_id": fake.team_id,
                "private_key": fake.private_key_pem(),
                "topic": fake.topic,
                "base_url": fake.url,
                "ca_file": fake.ca_file,
            }
        )
        provider = ApnsProvider(settings)
        try:
            await provider.send(make_message(Channel.push, to="ab" * 32, data=SIGNER.data(n)))
        finally:
            await provider.aclose()
    body = fake.requests[0].body
    assert verify_engagement_token(body[PUSH_DATA_KEY], secrets=["worker-secret"]).notification_id == n.id
    assert "alert" in body["aps"]
