"""Each real provider adapter end to end: API -> log -> Kafka -> worker -> provider fake -> log.

The workers here are configured with APNS, FCM, Twilio and SendGrid credentials pointing at the
local fakes (base-URL settings that production leaves at the real hosts). They run against a
database and broker of their own so they don't share consumer groups with the sandbox stack.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest

from clarion.broker import TansuBroker
from clarion.engagement_tokens import PUSH_DATA_KEY
from clarion.kafka import create_topics
from clarion.pg import asyncpg_dsn
from clarion.settings import Settings
from harness.fakes.apns import FakeApns
from harness.fakes.fcm import FakeFcm
from harness.fakes.sendgrid import FakeSendGrid
from harness.fakes.twilio import FakeTwilio
from harness.services import ApiServer, api_client, drop_database, fresh_database
from providers.settings import ProvidersSettings
from schema.db import create_engine
from schema.enums import Channel
from tests.conftest import Stack, make_tenant
from tests.fixtures.delivery import status_of, wait_status
from tests.fixtures.sends import email_send
from workers.app import Worker


@dataclass
class RealStack:
    client: httpx.AsyncClient
    settings: Settings
    apns: FakeApns
    fcm: FakeFcm
    twilio: FakeTwilio
    sendgrid: FakeSendGrid


def provider_accounts(
    apns: FakeApns, fcm: FakeFcm, twilio: FakeTwilio, sendgrid: FakeSendGrid
) -> dict[str, Any]:
    """The `CLARION_PROVIDERS__...` settings that point every real adapter at its fake."""
    a = apns.info()
    return {
        "apns": {"key_id": a["key_id"], "team_id": a["team_id"], "topic": a["topic"],
                 "private_key": a["private_key"], "base_url": a["url"], "ca_file": a["ca_file"]},
        "fcm": {"service_account_json": __import__("json").dumps(fcm.service_account_info()), "base_url": fcm.url},
        "twilio": {"account_sid": twilio.account_sid, "auth_token": twilio.auth_token,
                   "from_number": "+14155550199", "base_url": twilio.url},
        "sendgrid": {"api_key": sendgrid.api_key, "from_email": "noreply@clarion.test", "base_url": sendgrid.url},
    }  # fmt: skip


@pytest.fixture(scope="module")
async def real(settings: Settings, stack: Stack) -> AsyncIterator[RealStack]:
    apns, fcm, twilio, sendgrid = FakeApns(), FakeFcm(), FakeTwilio(), FakeSendGrid()
    for fake in (apns, fcm, twilio, sendgrid):
        await fake.start()
    broker = TansuBroker()
    broker.start()
    url = await fresh_database("clarion_real")
    await create_topics(broker.bootstrap, partitions=1)
    own = settings.model_copy(update={
        "database_url": url, "kafka_bootstrap": broker.bootstrap,
        "providers": ProvidersSettings.model_validate(provider_accounts(apns, fcm, twilio, sendgrid)),
    })  # fmt: skip
    workers = [Worker(own, channel) for channel in Channel]
    await asyncio.gather(*(w.start() for w in workers))
    api = ApiServer(own)
    await api.start()
    engine = create_engine(url, pool_size=1)
    tenant = await make_tenant(engine)
    await engine.dispose()
    async with api_client(api.url, tenant.key) as client:
        yield RealStack(client, own, apns, fcm, twilio, sendgrid)
    await api.stop()
    await asyncio.gather(*(w.stop() for w in workers))
    broker.stop()
    for fake in (apns, fcm, twilio, sendgrid):
        await fake.stop()
    await drop_database(url)


async def test_email_goes_through_sendgrid_with_its_message_id_recorded(real: RealStack) -> None:
    address = f"ada-{secrets.token_hex(3)}@example.com"
    body = email_send(user={"id": f"u-{secrets.token_hex(3)}", "email": address})
    nid = (await real.client.post("/v1/notifications", json=body)).json()["id"]
    sent = await wait_status(real.client, nid, "sent")
    [request] = [
        r for r in real.sendgrid.requests if r.body["personalizations"][0]["to"][0]["email"] == address
    ]
    assert request.body["subject"] == "Your order 123 has shipped"
    assert sent["provider"] == "sendgrid"
    assert sent["provider_message_id"] and sent["provider_message_id"] in {
        a["provider_message_id"] for a in sent["delivery_attempts"]
    }


async def test_sms_goes_through_twilio_with_its_sid_recorded(real: RealStack) -> None:
    phone = "+1415555" + str(secrets.randbelow(9000) + 1000)
    body = email_send(
        channel="sms",
        template="otp",
        data={"code": "777111"},
        user={"id": f"u-{secrets.token_hex(3)}", "phone": phone},
    )
    nid = (await real.client.post("/v1/notifications", json=body)).json()["id"]
    sent = await wait_status(real.client, nid, "sent")
    [request] = [r for r in real.twilio.requests if r.body.get("To") == phone]
    assert "777111" in request.body["Body"] and request.body["From"] == "+14155550199"
    assert sent["provider"] == "twilio" and sent["provider_message_id"].startswith("SM")


async def test_push_to_a_user_with_two_devices_calls_apns_and_fcm_once_each(real: RealStack) -> None:
    apns_token, fcm_token = secrets.token_hex(32), "fcm-" + secrets.token_urlsafe(40)
    user = {
        "id": f"u-{secrets.token_hex(3)}",
        "devices": [{"platform": "apns", "token": apns_token}, {"platform": "fcm", "token": fcm_token}],
    }
    nid = (await real.client.post("/v1/notifications", json=email_send(channel="push", user=user))).json()[
        "id"
    ]
    sent = await wait_status(real.client, nid, "sent")
    assert [r.path for r in real.apns.requests if r.path.endswith(apns_token)] == [f"/3/device/{apns_token}"]
    [fcm_call] = [
        r for r in real.fcm.requests if r.path.endswith(":send") and r.body["message"]["token"] == fcm_token
    ]
    assert fcm_call.body["message"]["notification"]["title"]
    assert sorted(a["provider"] for a in sent["delivery_attempts"]) == ["apns", "fcm"]
    assert sent["provider_message_id"].count(",") == 1  # both ids recorded


async def test_unregistered_apns_token_fails_the_send_and_retires_the_device(real: RealStack) -> None:
    token = secrets.token_hex(32)
    real.apns.fail_token(token, "Unregistered")
    user_id = f"u-{secrets.token_hex(3)}"
    user = {"id": user_id, "devices": [{"platform": "apns", "token": token}]}
    nid = (await real.client.post("/v1/notifications", json=email_send(channel="push", user=user))).json()[
        "id"
    ]
    failed = await wait_status(real.client, nid, "failed")
    assert failed["error"]["code"] == "Unregistered"
    assert [a["outcome"] for a in failed["delivery_attempts"]] == ["invalid_recipient"]  # never retried
    conn = await asyncpg.connect(asyncpg_dsn(real.settings.database_url))
    try:
        device = await conn.fetchrow(
            "SELECT active, last_error, deactivated_at FROM devices WHERE token = $1", token
        )
    finally:
        await conn.close()
    assert device["active"] is False and "Unregistered" in device["last_error"] and device["deactivated_at"]
    again = await real.client.post(
        "/v1/notifications", json=email_send(channel="push", user_id=user_id, user=None)
    )
    assert again.status_code == 422 and again.json()["error"]["code"] == "no_device"
    assert (await status_of(real.client, nid))["attempts"] == 1


async def test_a_push_carries_its_event_token_and_the_device_reports_the_open_with_it(
    real: RealStack,
) -> None:
    apns_token, fcm_token = secrets.token_hex(32), "fcm-" + secrets.token_urlsafe(40)
    user = {
        "id": f"u-{secrets.token_hex(3)}",
        "devices": [{"platform": "apns", "token": apns_token}, {"platform": "fcm", "token": fcm_token}],
    }
    send = email_send(channel="push", user=user, data={"order_id": "7"})
    nid = (await real.client.post("/v1/notifications", json=send)).json()["id"]
    await wait_status(real.client, nid, "sent")
    [apns_call] = [r for r in real.apns.requests if r.path.endswith(apns_token)]
    [fcm_call] = [
        r for r in real.fcm.requests if r.path.endswith(":send") and r.body["message"]["token"] == fcm_token
    ]
    tokens = {apns_call.body[PUSH_DATA_KEY], fcm_call.body["message"]["data"][PUSH_DATA_KEY]}
    assert fcm_call.body["message"]["data"]["order_id"] == "7"  # the tenant's data is kept beside it

    base_url = str(real.client.base_url)
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as device:  # no API key
        for token in tokens:  # both devices report the same open: one event
            response = await device.post("/v1/device/events", json={"token": token, "type": "opened"})
            assert response.status_code == 200, response.text
    shown = await status_of(real.client, nid)
    assert [(e["type"], e["count"], e["source"]) for e in shown["engagement"]] == [("opened", 1, "device")]
    assert shown["status"] == "sent"


async def test_a_tenants_flood_to_one_fcm_device_leaves_another_tenants_pushes_on_time(
    real: RealStack,
) -> None:
    """FCM answers ``429 QUOTA_EXCEEDED`` past 240 pushes a minute to one device, as it does for the
    project's quota; the worker charges it to the sending tenant's own breaker. Before, the
    flooding tenant's refusals opened the worker's FCM breaker and the other tenant's pushes were
    still ``retrying`` 121 s later."""
    busy = "fcm-busy-" + secrets.token_urlsafe(32)
    real.fcm.use_up_device_quota(busy)
    engine = create_engine(real.settings.database_url, pool_size=1)
    flooder = await make_tenant(engine)
    await engine.dispose()
    user = {"id": "u-flood", "devices": [{"platform": "fcm", "token": busy}]}
    async with api_client(str(real.client.base_url), flooder.key) as theirs:
        ids = []
        for _ in range(12):
            r = await theirs.post("/v1/notifications", json=email_send(channel="push", user=user))
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        for nid in ids:  # every push refused in the worker, and rescheduled
            await wait_status(theirs, nid, "retrying")

    ours = [
        (await real.client.post("/v1/notifications", json=email_send(channel="push", user=u))).json()["id"]
        for u in (
            {"id": f"u-{i}", "devices": [{"platform": "fcm", "token": f"fcm-{secrets.token_hex(16)}"}]}
            for i in range(20)
        )
    ]
    for nid in ours:
        sent = await wait_status(real.client, nid, "sent", timeout_s=10)
        assert "retrying" not in [h["status"] for h in sent["history"]]
