"""Twilio status callbacks over the API: recorded once and never regressing a delivery, a STOP reply
opting the user out of SMS, forged requests refused with nothing changed, reports matched to their
notification by SID."""

from __future__ import annotations

import secrets

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine
from twilio.request_validator import RequestValidator

from api.webhooks import MAX_TWILIO_FIELDS
from tests.conftest import TenantInfo
from tests.fixtures.answers import assert_error
from tests.fixtures.hooked_api import hooks_fixture, opt_outs, provider_transitions  # noqa: F401 - hooks
from tests.fixtures.hooks import Hooks, callback, sent_notification, sent_sms, view


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


async def test_a_body_of_many_fields_is_refused_before_it_is_parsed(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    # Anonymous: 16,250 fields took 13.8 ms of the event loop each to parse, and more to sort and sign.
    sid, _, _ = await sent_sms(engine, tenant)
    params = {**callback(sid, "delivered"), **{f"f{i}": "1" for i in range(MAX_TWILIO_FIELDS)}}
    signed = hooks_sig(hooks, params)  # even signed: Twilio's callbacks carry about twenty fields
    assert_error(await hooks.twilio(params, signature=signed), 403, "invalid_signature")
    fine = callback(sid, "delivered")
    assert (await hooks.twilio(fine, signature=hooks_sig(hooks, fine))).status_code == 200


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
