"""Provider webhooks over the API: signatures (with docs/providers.md's test vectors), forged or stale
requests refused with nothing changed, duplicate and out-of-order reports, opt-outs."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.datastructures import FormData
from twilio.request_validator import RequestValidator

from api.sendgrid_signature import sendgrid_signature_valid
from api.webhooks import twilio_signature_valid
from clarion.settings import Settings
from harness.fakes.sendgrid import FakeSendGrid
from harness.services import ApiServer, api_client
from tests.conftest import TenantInfo
from tests.fixtures.answers import assert_error
from tests.fixtures.hooks import (
    SENDGRID_PATH,
    TWILIO_PATH,
    Hooks,
    callback,
    event,
    hooked_api,
    sent_notification,
    sent_sms,
    view,
)

# docs/providers.md 3.5 and 4.5.
TWILIO_VECTOR = {
    "token": "12345",
    "url": "https://mycompany.com/myapp.php?foo=1&bar=2",
    "params": {
        "CallSid": "CA1234567890ABCDE",
        "Caller": "+12349013030",
        "Digits": "1234",
        "From": "+12349013030",
        "To": "+18005551212",
    },
    "signature": "0/KCTR6DLpKmkAf8muzZqo1nDgQ=",
}
SENDGRID_VECTOR = {
    "public_key": "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEDr2LjtURuePQzplybdC+u4CwrqDqBaWjcMMsTbhdbcwHBcepxo7yAQGhHPTnlvFYPAZFceEu/1FwCM/QmGUhA==",
    "timestamp": "1588788367",
    "payload": b'{"category":"example_payload","event":"test_event","message_id":"message_id"}',
    "signature": "MEUCIQCtIHJeH93Y+qpYeWrySphQgpNGNr/U+UyUlBkU6n7RAwIgJTz2C+8a8xonZGi6BpSzoQsbVRamr2nlxFDWYNH2j/0=",
}


@pytest.fixture(scope="module")
async def hooks(settings: Settings) -> AsyncIterator[Hooks]:
    async with hooked_api(settings) as h:
        yield h


async def opt_outs(client: httpx.AsyncClient, external_id: str) -> list[tuple[str, str]]:
    response = await client.get(f"/v1/users/{external_id}/preferences")
    assert response.status_code == 200, response.text
    return sorted((p["channel"], p["category"]) for p in response.json()["preferences"] if not p["opted_in"])


def provider_transitions(body: dict[str, Any]) -> list[str]:
    return [h["status"] for h in body["history"] if (h["detail"] or "").startswith(("twilio", "sendgrid"))]


# --- signature checks ------------------------------------------------------------------------------


def test_twilio_signature_matches_the_documented_test_vector() -> None:
    v = TWILIO_VECTOR
    assert RequestValidator(v["token"]).compute_signature(v["url"], v["params"]) == v["signature"]
    params = FormData(list(v["params"].items()))  # type: ignore[union-attr]
    assert twilio_signature_valid(
        auth_token=v["token"], url=v["url"], params=params, signature=v["signature"]
    )
    tampered = FormData([*v["params"].items(), ("Extra", "1")])  # type: ignore[union-attr]
    assert not twilio_signature_valid(
        auth_token=v["token"], url=v["url"], params=tampered, signature=v["signature"]
    )
    assert not twilio_signature_valid(
        auth_token="54321", url=v["url"], params=params, signature=v["signature"]
    )


def test_sendgrid_signature_matches_the_documented_test_vector_within_ten_minutes() -> None:
    v = SENDGRID_VECTOR
    at_s = int(v["timestamp"]) + 60  # type: ignore[call-overload]
    common = {"public_key": v["public_key"], "signature": v["signature"], "timestamp": v["timestamp"]}
    assert sendgrid_signature_valid(payload=v["payload"], now_s=at_s, **common)  # type: ignore[arg-type]
    assert not sendgrid_signature_valid(payload=v["payload"] + b" ", now_s=at_s, **common)  # type: ignore[arg-type, operator]
    assert not sendgrid_signature_valid(payload=v["payload"], now_s=at_s + 600, **common)  # type: ignore[arg-type]


# --- Twilio status callbacks -----------------------------------------------------------------------


async def test_delivered_callback_is_recorded_once_and_the_status_stays_sent(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    sid, nid, _ = await sent_sms(engine, tenant)

    first = await hooks.twilio(callback(sid, "delivered"))
    again = await hooks.twilio(callback(sid, "delivered"))
    late_sent = await hooks.twilio(callback(sid, "sent"))

    assert first.status_code == 200 and first.json()["recorded"] == 1
    assert again.status_code == 200 and again.json()["duplicate"] == 1
    assert late_sent.status_code == 200 and late_sent.json()["ignored"] == 1
    body = await view(client, nid)
    assert body["status"] == "sent"
    assert provider_transitions(body) == ["delivered"]
    assert sid in body["history"][-1]["detail"]
    assert body["error"] is None


async def test_a_late_failure_after_delivered_does_not_regress_it(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    sid, nid, external_id = await sent_sms(engine, tenant)

    assert (await hooks.twilio(callback(sid, "delivered"))).json()["recorded"] == 1
    late = await hooks.twilio(callback(sid, "undelivered", ErrorCode="30004"))

    assert late.json()["duplicate"] == 1
    body = await view(client, nid)
    assert provider_transitions(body) == ["delivered"]
    assert body["error"] is None
    assert await opt_outs(client, external_id) == []


async def test_stop_reply_records_the_error_and_opts_the_user_out_of_sms(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    sid, nid, external_id = await sent_sms(engine, tenant)
    phone = (await client.get(f"/v1/users/{external_id}")).json()["phone"]

    response = await hooks.twilio(callback(sid, "undelivered", ErrorCode="21610", To=phone))

    assert response.status_code == 200 and response.json()["opted_out"] == 1
    body = await view(client, nid)
    assert body["status"] == "sent"
    assert provider_transitions(body) == ["undelivered"]
    assert "21610" in body["history"][-1]["detail"]
    assert body["error"]["code"] == "21610"
    assert await opt_outs(client, external_id) == [("sms", "*")]


async def test_a_stop_reply_outranks_the_users_earlier_category_opt_ins_for_sms(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    sid, _, external_id = await sent_sms(engine, tenant)
    phone = (await client.get(f"/v1/users/{external_id}")).json()["phone"]
    chosen = [
        {"channel": "sms", "category": "orders", "opted_in": True},
        {"channel": "*", "category": "promos", "opted_in": True},
        {"channel": "email", "category": "news", "opted_in": True},
    ]
    put = await client.put(f"/v1/users/{external_id}/preferences", json={"preferences": chosen})
    assert put.status_code == 200, put.text

    response = await hooks.twilio(callback(sid, "undelivered", ErrorCode="21610", To=phone))

    assert response.status_code == 200 and response.json()["opted_out"] == 1
    # Every category the user had opted into is closed for SMS; other channels keep their choices.
    assert await opt_outs(client, external_id) == [("sms", "*"), ("sms", "orders"), ("sms", "promos")]
    prefs = (await client.get(f"/v1/users/{external_id}/preferences")).json()["preferences"]
    opted_in = sorted((p["channel"], p["category"]) for p in prefs if p["opted_in"])
    assert opted_in == [("*", "promos"), ("email", "news")]


async def test_unreachable_handset_is_recorded_without_opting_out(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    sid, nid, external_id = await sent_sms(engine, tenant)

    await hooks.twilio(callback(sid, "undelivered", ErrorCode="30003"))

    body = await view(client, nid)
    assert provider_transitions(body) == ["undelivered"] and "30003" in body["history"][-1]["detail"]
    assert body["error"] is None  # 30003 is not a dead number
    assert await opt_outs(client, external_id) == []


async def test_forged_or_missing_twilio_signature_is_refused_and_changes_nothing(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    sid, nid, external_id = await sent_sms(engine, tenant)
    params = callback(sid, "failed", ErrorCode="21610")
    forged = RequestValidator("not-the-token").compute_signature(hooks.twilio_url, params)
    other_url = RequestValidator(hooks.auth_token).compute_signature(hooks.twilio_url + "?x=1", params)
    before = await view(client, nid)

    for response in (
        await hooks.twilio(params, signature=forged),
        await hooks.twilio(params, signature=""),
        await hooks.twilio(params, signature=other_url),  # signed for another URL
        await hooks.twilio({**params, "ErrorCode": "30003"}, signature=hooks_sig(hooks, params)),
    ):
        assert_error(response, 403, "invalid_signature")
    after = await view(client, nid)
    assert after["history"] == before["history"] and after["error"] is None
    assert await opt_outs(client, external_id) == []


def hooks_sig(hooks: Hooks, params: dict[str, str]) -> str:
    return str(RequestValidator(hooks.auth_token).compute_signature(hooks.twilio_url, params))


async def test_signature_covers_the_query_string_of_the_public_url(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    sid, nid, _ = await sent_sms(engine, tenant)

    response = await hooks.twilio(callback(sid, "delivered"), query="account=main")

    assert response.status_code == 200, response.text
    assert provider_transitions(await view(client, nid)) == ["delivered"]


async def test_callback_for_an_unknown_sid_is_404(hooks: Hooks) -> None:
    response = await hooks.twilio(callback("SM" + secrets.token_hex(16), "delivered"))
    assert_error(response, 404, "unknown_message")


# --- SendGrid Event Webhook ------------------------------------------------------------------------


async def test_events_are_recorded_once_per_sg_event_id(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    email = f"{external_id}@example.com"
    batch = [event(nid, "processed", email), event(nid, "delivered", email, response="250 OK")]

    first = await hooks.events(batch)
    replay = await hooks.events(batch)  # SendGrid retries a batch it thinks failed

    assert first.status_code == 200, first.text
    assert first.json() | {"opted_out": 0} == {
        "recorded": 1, "duplicate": 0, "ignored": 1, "unknown": 0, "opted_out": 0
    }  # fmt: skip
    assert replay.json()["duplicate"] == 1 and replay.json()["recorded"] == 0
    body = await view(client, nid)
    assert body["status"] == "sent"
    assert provider_transitions(body) == ["delivered"]
    assert batch[1]["sg_event_id"] in body["history"][-1]["detail"]


async def test_events_without_an_sg_event_id_are_recorded_once_across_replays(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    delivered = event(nid, "delivered", f"{external_id}@example.com", response="250 OK")
    del delivered["sg_event_id"]
    first = await hooks.events([delivered])
    replay = await hooks.events([delivered])
    assert first.json()["recorded"] == 1
    assert replay.json()["recorded"] == 0 and replay.json()["duplicate"] == 1
    assert provider_transitions(await view(client, nid)) == ["delivered"]


async def test_an_event_holding_a_nul_does_not_sink_its_signed_batch(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    other, other_user = await sent_notification(engine, tenant, channel="email")
    batch = [
        event(
            nid, "bounce", f"{external_id}@example.com", type="blocked", reason="550 no\x00such\ud800 user"
        ),
        event(other, "delivered", f"{other_user}@example.com", response="250 OK"),
    ]
    response = await hooks.events(batch)
    assert response.status_code == 200, response.text
    assert response.json()["recorded"] == 2
    assert provider_transitions(await view(client, other)) == ["delivered"]
    detail = (await view(client, nid))["history"][-1]["detail"]
    assert "nosuch" in detail.replace("?", "") and "\x00" not in detail


async def test_hard_bounce_opts_the_user_out_of_email_but_a_block_does_not(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    blocked_nid, blocked_user = await sent_notification(engine, tenant, channel="email")
    bounced_nid, bounced_user = await sent_notification(engine, tenant, channel="email")

    response = await hooks.events(
        [
            event(
                blocked_nid, "bounce", f"{blocked_user}@example.com", type="blocked", reason="421 try later"
            ),
            event(bounced_nid, "bounce", f"{bounced_user}@example.com", type="bounce", reason="550 5.1.1"),
        ]
    )

    assert response.status_code == 200 and response.json()["opted_out"] == 1
    assert await opt_outs(client, blocked_user) == []
    assert await opt_outs(client, bounced_user) == [("email", "*")]
    assert "550 5.1.1" in (await view(client, bounced_nid))["history"][-1]["detail"]


async def test_group_unsubscribe_opts_out_of_the_notifications_category_only(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email", category="newsletter")

    await hooks.events([event(nid, "group_unsubscribe", f"{external_id}@example.com", asm_group_id=42)])

    assert await opt_outs(client, external_id) == [("email", "newsletter")]
    assert provider_transitions(await view(client, nid)) == ["group_unsubscribe"]


async def test_spam_report_for_an_address_the_user_no_longer_has_opts_nobody_out(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")

    await hooks.events([event(nid, "spamreport", "old-address@example.com")])

    assert provider_transitions(await view(client, nid)) == ["spamreport"]
    assert await opt_outs(client, external_id) == []


async def test_forged_stale_or_unsigned_event_batches_are_refused_and_change_nothing(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    batch = [event(nid, "unsubscribe", f"{external_id}@example.com")]
    payload = json.dumps(batch).encode()
    stale = hooks.sendgrid.signed_headers(payload, timestamp=int(time.time()) - 11 * 60)
    forged = FakeSendGrid().signed_headers(payload)  # another key
    tampered = hooks.sendgrid.signed_headers(payload.replace(b"unsubscribe", b"spamreport"))
    before = await view(client, nid)

    for headers in (stale, forged, tampered, {"Content-Type": "application/json"}):
        assert_error(await hooks.events(batch, headers=headers), 403, "invalid_signature")
    assert (await view(client, nid))["history"] == before["history"]
    assert await opt_outs(client, external_id) == []


async def test_events_for_notifications_we_do_not_know_are_counted_not_failed(hooks: Hooks) -> None:
    response = await hooks.events(
        [event(str(UUID(int=secrets.randbits(128))), "delivered", "x@example.com"), {"event": "delivered"}]
    )
    assert response.status_code == 200 and response.json()["unknown"] == 2


async def test_webhooks_answer_404_when_the_provider_is_not_configured(api: ApiServer) -> None:
    async with api_client(api.url, None) as client:
        twilio = await client.post(TWILIO_PATH, data=callback("SM1", "delivered"))
        sendgrid = await client.post(SENDGRID_PATH, content=b"[]")
    assert_error(twilio, 404, "not_configured")
    assert_error(sendgrid, 404, "not_configured")


async def test_an_event_batch_larger_than_a_send_body_is_accepted(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    batch = [event(nid, "processed", f"{external_id}@example.com") for _ in range(400)]
    assert len(json.dumps(batch)) > hooks.server.settings.max_body_bytes

    response = await hooks.events(batch)

    assert response.status_code == 200, response.text
    assert response.json()["ignored"] == 400


async def test_twilio_report_arriving_before_the_sid_is_recorded_finds_its_notification(
    hooks: Hooks, client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, _ = await sent_notification(engine, tenant, channel="sms", provider_message_id=None)
    sid = "SM" + secrets.token_hex(16)

    response = await hooks.twilio(callback(sid, "delivered"), query=f"notification_id={nid}")

    assert response.status_code == 200, response.text
    assert response.json()["recorded"] == 1
    assert provider_transitions(await view(client, nid)) == ["delivered"]


async def test_twilio_report_naming_another_sid_than_the_recorded_one_is_refused(
    hooks: Hooks, client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    recorded = "SM" + secrets.token_hex(16)
    nid, _ = await sent_notification(engine, tenant, channel="sms", provider_message_id=recorded)

    response = await hooks.twilio(
        callback("SM" + secrets.token_hex(16), "delivered"), query=f"notification_id={nid}"
    )

    assert_error(response, 404, "unknown_message")
    assert provider_transitions(await view(client, nid)) == []
