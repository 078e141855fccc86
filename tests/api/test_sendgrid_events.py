"""SendGrid's Event Webhook over the API: events recorded once across replays, bounces, unsubscribes and
spam reports opting out whom they should, forged or stale batches refused with nothing changed,
unknown notifications counted, large batches accepted."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from api.sendgrid_events import MAX_HISTORY_EVENTS, MAX_REASON_CHARS
from core.engagement import MAX_COUNTED
from harness.fakes.sendgrid import FakeSendGrid
from harness.services import api_client
from tests.conftest import METRICS_TOKEN, TenantInfo
from tests.fixtures.answers import assert_error, scrape
from tests.fixtures.hooked_api import hooks_fixture, opt_outs, provider_transitions  # noqa: F401 - hooks
from tests.fixtures.hooks import SENDGRID_PATH, Hooks, event, sent_notification, view


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


async def test_an_event_batch_larger_than_a_send_body_is_accepted(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    batch = [event(nid, "processed", f"{external_id}@example.com") for _ in range(400)]
    assert len(json.dumps(batch)) > hooks.server.settings.max_body_bytes

    response = await hooks.events(batch)

    assert response.status_code == 200, response.text
    assert response.json()["ignored"] == 400


def _batch_of(size_bytes: int, events: list[dict[str, Any]], padding: dict[str, Any]) -> bytes:
    """``events``, then ``padding`` (a SendGrid event) grown to make the batch ``size_bytes`` long."""
    padding = {**padding, "useragent": ""}
    fill = size_bytes - len(json.dumps([*events, padding]).encode())
    payload = json.dumps([*events, {**padding, "useragent": "x" * fill}]).encode()
    assert len(payload) == size_bytes
    return payload


async def test_a_batch_past_sendgrids_documented_size_is_recorded_and_one_well_past_it_is_a_413(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    """SendGrid posts a batch once it reaches 768 KB (its Event Webhook guide): one that ends a
    little past that is recorded; one half as large again (1.2 MB, what SendGrid does not send) is
    refused before it is read, with nothing changed, whether it says its length or comes in chunks."""
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    email = f"{external_id}@example.com"
    processed = [event(nid, "processed", email) for _ in range(2000)]
    documented = _batch_of(800_000, [*processed, event(nid, "deferred", email)], event(nid, "open", email))
    over = _batch_of(
        1_200_000,
        [*processed, event(nid, "bounce", email, type="bounce", reason="550 5.1.1")],
        event(nid, "open", email),
    )

    async def chunked() -> AsyncIterator[bytes]:
        for at in range(0, len(over), 64 * 1024):
            yield over[at : at + 64 * 1024]

    async with httpx.AsyncClient(base_url=hooks.server.url, timeout=30) as sender:
        recorded = await sender.post(
            SENDGRID_PATH, content=documented, headers=hooks.sendgrid.signed_headers(documented)
        )
        refusals = [
            await sender.post(SENDGRID_PATH, content=body, headers=hooks.sendgrid.signed_headers(over))
            for body in (over, chunked())
        ]

    assert recorded.status_code == 200, recorded.text
    assert (recorded.json()["recorded"], recorded.json()["ignored"]) == (2, 2000)  # deferred, open
    for refused in refusals:
        assert_error(refused, 413, "payload_too_large")
    assert provider_transitions(await view(client, nid)) == ["deferred"]
    assert await opt_outs(client, external_id) == []


async def test_a_signed_batch_nested_past_the_parsers_limit_is_a_400(hooks: Hooks) -> None:
    payload = b"[" * 100_000 + b"]" * 100_000
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.post(
            hooks.server.url + SENDGRID_PATH, content=payload, headers=hooks.sendgrid.signed_headers(payload)
        )
    assert_error(response, 400, "malformed_json")


async def test_one_notification_takes_at_most_its_share_of_provider_events(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    """A flood of distinct events for one notification (a runaway or forged batch) stops growing
    its history at MAX_HISTORY_EVENTS; replays of the recorded ones are still recognised."""
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    flood = [event(nid, "deferred", f"{external_id}@example.com") for _ in range(3 * MAX_HISTORY_EVENTS)]
    first = (await hooks.events(flood)).json()
    assert (first["recorded"], first["ignored"]) == (MAX_HISTORY_EVENTS, 2 * MAX_HISTORY_EVENTS)
    more = (await hooks.events([event(nid, "delivered", f"{external_id}@example.com")])).json()
    assert (more["recorded"], more["ignored"]) == (0, 1)
    replay = (await hooks.events(flood[:5])).json()
    assert replay["duplicate"] == 5
    assert len(provider_transitions(await view(client, nid))) == MAX_HISTORY_EVENTS


async def test_a_bounce_reason_of_megabytes_is_cut_in_the_history(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    reason = "550 " + "x" * 1_000_000
    batch = [event(nid, "bounce", f"{external_id}@example.com", type="blocked", reason=reason)]

    response = await hooks.events(batch)

    assert response.status_code == 200 and response.json()["recorded"] == 1
    detail = (await view(client, nid))["history"][-1]["detail"]
    assert detail.startswith("sendgrid bounce: type blocked; 550 xxx")
    assert len(detail) <= MAX_REASON_CHARS + 200  # the event's name and its replay marker


async def test_opens_past_what_the_engagement_row_counts_are_ignored_without_a_write_each(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    opens = [event(nid, "open", f"{external_id}@example.com") for _ in range(3 * MAX_COUNTED)]

    answer = (await hooks.events(opens)).json()

    assert (answer["recorded"], answer["ignored"], answer["duplicate"]) == (MAX_COUNTED, 2 * MAX_COUNTED, 0)
    opened = [e for e in (await view(client, nid))["engagement"] if e["type"] == "opened"]
    assert [e["count"] for e in opened] == [MAX_COUNTED]


async def test_a_new_open_after_many_repeats_of_one_in_its_batch_is_counted(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo, client: httpx.AsyncClient
) -> None:
    """Repeats of one open in a batch are one open the row could count, not MAX_COUNTED of them:
    the cap on a batch's statements must not refuse a new open behind them."""
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    one = event(nid, "open", f"{external_id}@example.com")
    fresh = event(nid, "open", f"{external_id}@example.com")

    answer = (await hooks.events([one] * (MAX_COUNTED + 5) + [fresh])).json()

    assert (answer["recorded"], answer["ignored"], answer["duplicate"]) == (2, 0, MAX_COUNTED + 4)
    opened = [e for e in (await view(client, nid))["engagement"] if e["type"] == "opened"]
    assert [e["count"] for e in opened] == [2]


async def test_a_batchs_events_are_in_the_metric_by_event_and_result(
    hooks: Hooks, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    """Counted once per batch and (event, result), not an increment per event: the counts add up."""
    nid, external_id = await sent_notification(engine, tenant, channel="email")
    email = f"{external_id}@example.com"
    deferred, opened = event(nid, "deferred", email), event(nid, "open", email)
    batch = [deferred, deferred, event(nid, "deferred", email), opened, opened, opened]
    batch += [event(nid, "click", email, url="https://a.example/"), event(None, "spamreport", email)]  # type: ignore[arg-type]
    wanted = {
        ("deferred", "recorded"): 2, ("deferred", "duplicate"): 1, ("open", "recorded"): 1,
        ("open", "duplicate"): 2, ("click", "recorded"): 1, ("spamreport", "unknown"): 1,
    }  # fmt: skip

    async with api_client(hooks.server.url, METRICS_TOKEN) as scraper:

        async def counts() -> dict[tuple[str, str], float]:
            text = (await scraper.get("/metrics")).text
            return {
                (kind, result): scrape(
                    text,
                    "clarion_provider_webhook_events_total",
                    provider="sendgrid",
                    event=kind,
                    result=result,
                )
                for kind, result in wanted
            }

        before = await counts()
        answer = await hooks.events(batch)
        after = await counts()

    assert answer.status_code == 200, answer.text
    assert {k: after[k] - before[k] for k in wanted} == wanted
