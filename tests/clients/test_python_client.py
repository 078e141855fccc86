"""The Python client (clients/python) against a live API: its models match /openapi.json, the
README's first send works with it, errors raise typed exceptions, a 429 is retried with the same
event_id after Retry-After, the batch helper splits any iterable into calls of 1,000, and
analytics follows the API's pages to the last.

The API runs in this test's event loop, so the sync client is driven from a thread."""

from __future__ import annotations

import asyncio
import secrets
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from clarion_client import (
    AsyncClarion,
    AuthenticationError,
    Clarion,
    ClarionError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    ServiceUnavailableError,
)
from clarion_client._core import retry_after_s
from clarion_client.models import SCHEMAS, EngagementReport, Notification, Recipient
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncEngine

from api.template_list import MAX_PAGE
from harness.services import ApiServer, wait_until
from tests.conftest import TenantInfo


def first_send(event_id: str | None = None) -> Notification:
    """The README's first send."""
    return Notification(
        event_id=event_id or f"order-{secrets.token_hex(4)}-shipped",
        user=Recipient(id="u-1", email="ada@example.com", phone="+14155550100", locale="en"),
        channel="email",
        category="orders",
        priority="high",
        template="order_shipped",
        data={"order_id": "123"},
    )


def _required(model: type[BaseModel]) -> set[str]:
    return {name for name, field in model.model_fields.items() if field.is_required()}


async def test_the_client_models_match_the_openapi_document(client: httpx.AsyncClient) -> None:
    schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    drift = {}
    for model, name in SCHEMAS.items():
        api_fields = set(schemas[name]["properties"])
        if set(model.model_fields) != api_fields:
            drift[model.__name__] = {
                "only in the API": sorted(api_fields - set(model.model_fields)),
                "only in the client": sorted(set(model.model_fields) - api_fields),
            }
        api_required = set(schemas[name].get("required", []))
        is_request = model.model_config.get("extra") == "forbid"
        if is_request and _required(model) != api_required:
            drift[model.__name__ + " required"] = sorted(_required(model) ^ api_required)
        if not is_request and not _required(model) <= api_required:
            drift[model.__name__ + " required"] = sorted(_required(model) - api_required)
    assert drift == {}


async def test_the_client_reports_an_open_once(api: ApiServer, tenant: TenantInfo) -> None:
    async with AsyncClarion(tenant.key, api.url) as clarion:
        accepted = await clarion.send(first_send())
        first = await clarion.report_engagement(accepted.id, {"type": "opened"})
        again = await clarion.report_engagement(accepted.id, EngagementReport(type="opened"))
        shown = await clarion.get_notification(accepted.id)
    assert (first.duplicate, again.duplicate, again.count) == (False, True, 1)
    assert [(e.type, e.count, e.source) for e in shown.engagement] == [("opened", 1, "api")]


async def test_first_send_with_the_sync_client(api: ApiServer, tenant: TenantInfo) -> None:
    def run() -> None:
        with Clarion(tenant.key, api.url) as clarion:
            accepted = clarion.send(first_send("order-123-shipped"))
            assert accepted.status == "accepted" and not accepted.duplicate
            again = clarion.send(first_send("order-123-shipped"))
            assert again.duplicate and again.id == accepted.id
            status = clarion.get_notification(accepted.id)
            assert status.event_id == "order-123-shipped" and status.template == "order_shipped"

            with pytest.raises(ConflictError) as conflict:
                clarion.send({**first_send("order-123-shipped").model_dump(), "data": {"order_id": "9"}})
            assert conflict.value.code == "event_id_conflict" and conflict.value.status == 409
            with pytest.raises(InvalidRequestError) as invalid:
                clarion.send(first_send().model_copy(update={"data": {}}))
            assert invalid.value.code == "missing_template_variable"
            assert invalid.value.details == {"variable": "order_id"}
            with pytest.raises(NotFoundError):
                clarion.get_notification("0193a8c2-0000-7000-8000-000000000000")

        with Clarion("clk_nope_nope", api.url) as stranger, pytest.raises(AuthenticationError) as denied:
            stranger.send(first_send())
        assert denied.value.code == "unauthorized"

    await asyncio.to_thread(run)


async def test_analytics_reads_every_page_with_both_clients(
    api: ApiServer, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    # Today's hours: a fixed past day has no partition in the session's database, and its 1,440 rows
    # went to analytics_hourly's default, which tests/api/test_ops.py finds empty when it runs after.
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    async with engine.begin() as conn:  # 24 hours x 60 templates: 1,440 rows, two pages of the API's
        await conn.exec_driver_sql(
            "INSERT INTO analytics_hourly (tenant_id, hour, channel, template, template_version, category,"
            " provider, accepted, sent)"
            " SELECT $1, $2::timestamptz + make_interval(hours => h), 'email', 't-' || t, 1, '', '', 2, 1"
            " FROM generate_series(0, 23) h, generate_series(1, 60) t",
            (tenant.id, start),
        )
    query = {"since": start, "until": start + timedelta(days=1), "interval": "hour", "group_by": ["template"]}
    async with AsyncClarion(tenant.key, api.url) as clarion:
        rows = await clarion.analytics(**query)  # type: ignore[arg-type]
    keys = [(r.at, r.group["template"]) for r in rows]
    assert len(keys) == len(set(keys)) == 24 * 60 and keys == sorted(keys)
    assert rows[0].counts["accepted"] == 2 and rows[0].rates["sent_rate"] == 0.5

    def run() -> None:
        with Clarion(tenant.key, api.url) as clarion:
            assert clarion.analytics(**query) == rows  # type: ignore[arg-type]

    await asyncio.to_thread(run)


async def test_users_preferences_and_templates_with_the_async_client(
    api: ApiServer, tenant: TenantInfo
) -> None:
    async with AsyncClarion(tenant.key, api.url) as clarion:
        user = await clarion.put_user("u-7", {"email": "grace@example.com", "timezone": "Europe/Lisbon"})
        assert user.email == "grace@example.com"
        device = await clarion.add_device("u-7", {"platform": "fcm", "token": "f" * 40})
        assert device.active
        assert [d.token for d in (await clarion.get_user("u-7")).devices] == ["f" * 40]
        await clarion.remove_device("u-7", "f" * 40)

        prefs = await clarion.set_preferences("u-7", [{"channel": "sms", "category": "*", "opted_in": False}])
        assert prefs.effective["*"]["sms"] is False
        assert (await clarion.get_preferences("u-7")).preferences[0].opted_in is False

        created = await clarion.create_template(
            {
                "name": "welcome_back",
                "channel": "email",
                "subject": "Hi {{ name }}",
                "body": "Welcome {{ name }}",
                "sample_data": {"name": "Sam"},
            }
        )
        preview = await clarion.preview_template(
            "welcome_back", {"channel": "email", "data": {"name": "Ada"}}
        )
        assert preview.body == "Welcome Ada" and preview.version == created.version
        assert "welcome_back" in {t.name for t in await clarion.list_templates("email")}
        assert (await clarion.get_template("welcome_back"))[0].version == created.version
        for i in range(MAX_PAGE):  # past one page: the client follows the API's Link to the next
            await clarion.create_template(
                {
                    "name": "welcome_back",
                    "channel": "email",
                    "subject": "Hi",
                    "body": f"v{i}",
                    "activate": False,
                }
            )
        versions = [t.version for t in await clarion.get_template("welcome_back")]
        assert versions == list(range(MAX_PAGE + 1, 0, -1))

        later = datetime.now(UTC) + timedelta(days=1)
        accepted = await clarion.send(first_send().model_copy(update={"send_at": later}))
        assert (await clarion.cancel(accepted.id)).status == "cancelled"


class CountingTransport(httpx.AsyncHTTPTransport):
    """The real transport, remembering what was sent."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, bytes, int]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        self.sent.append((request.url.path, request.content, response.status_code))
        return response


async def test_a_429_is_retried_after_retry_after_with_the_same_event_id(
    api: ApiServer, client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    rule = {"name": "one-per-2s", "scope": "tenant", "limit": 1, "period_s": 2, "action": "reject"}
    assert (await client.post("/v1/rate-limits", json=rule)).status_code == 201

    async def refused() -> bool:
        body = first_send().model_dump(mode="json", exclude_none=True)
        return (await client.post("/v1/notifications", json=body)).status_code == 429

    await wait_until(refused, 15, 0.05)  # the rule is enforced (and the bucket is empty now)
    transport = CountingTransport()
    send = first_send()
    async with AsyncClarion(tenant.key, api.url, max_retries=5, transport=transport) as clarion:
        accepted = await clarion.send(send)
    assert accepted.status == "accepted" and not accepted.duplicate
    statuses = [status for _, _, status in transport.sent]
    assert statuses[0] == 429 and statuses[-1] == 202, statuses
    assert len({content for _, content, _ in transport.sent}) == 1  # every attempt: the same body
    assert all(f'"event_id":"{send.event_id}"'.encode() in content for _, content, _ in transport.sent)


async def test_batch_splits_any_iterable_into_calls_of_1000(api: ApiServer, tenant: TenantInfo) -> None:
    later = datetime.now(UTC) + timedelta(days=30)
    items = (first_send().model_copy(update={"send_at": later}) for _ in range(2_050))  # no len()
    seen: list[tuple[int, int | None]] = []
    transport = CountingTransport()
    async with AsyncClarion(tenant.key, api.url, transport=transport) as clarion:
        results = await clarion.send_batch(items, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1000, None), (2000, None), (2050, None)]
    assert [r.accepted for r in results] == [1000, 1000, 50]
    assert [path for path, _, _ in transport.sent] == ["/v1/notifications/batch"] * 3


def test_batch_refuses_a_size_over_the_api_limit() -> None:
    with Clarion("clk_x_y") as clarion, pytest.raises(ValueError, match="1 to 1000"):
        clarion.send_batch([first_send()], batch_size=1001)


# The retry arithmetic alone (no server can be made to answer 503 with an HTTP date on demand).


def _answer(status: int, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers=headers, request=httpx.Request("POST", "http://x/"))


@pytest.mark.parametrize(
    ("headers", "attempt", "wait"),
    [
        ({"Retry-After": "2"}, 1, 2.0),
        ({}, 1, 0.5),
        ({}, 3, 2.0),
        ({"Retry-After": "9999"}, 1, 30.0),
        # What a proxy or a broken server may answer: the backoff, never NaN (time.sleep raised on
        # it and asyncio.sleep never returned) nor the date parser's ValueError out of a send.
        ({"Retry-After": "nan"}, 1, 0.5),
        ({"Retry-After": "soon"}, 2, 1.0),
        ({"Retry-After": "Fri, 99 Foo 2026 25:61:00 GMT"}, 1, 0.5),
    ],
)
def test_retry_wait(headers: dict[str, str], attempt: int, wait: float) -> None:
    assert retry_after_s(_answer(503, **headers), attempt, base_s=0.5, max_s=30.0) == wait


def test_a_503_past_the_retries_raises_with_the_error_body() -> None:
    answers = iter(
        [_answer(503, **{"Retry-After": "0"})] * 2
        + [httpx.Response(503, json={"error": {"code": "database_unavailable", "message": "m"}})]
    )
    calls: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.content)
        return next(answers)

    with Clarion("k", transport=httpx.MockTransport(handler), max_retries=2) as clarion:
        with pytest.raises(ServiceUnavailableError) as unavailable:
            clarion.send(first_send("e-1"))
    assert unavailable.value.code == "database_unavailable" and len(calls) == 3 and len(set(calls)) == 1


def test_a_next_link_to_another_origin_is_refused_without_sending_the_key_there() -> None:
    """The template listings follow the answer's ``Link: rel="next"``; one naming another host
    (a proxy's, a misconfigured or hostile server's) got the next request with the API key."""
    seen: list[tuple[str, str | None]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers.get("authorization")))
        link = '<http://collector.example/v1/templates?cursor=x>; rel="next"'
        return httpx.Response(200, json=[], headers={"Link": link})

    with Clarion("clk_a_b", "http://api.example", transport=httpx.MockTransport(handler)) as clarion:
        with pytest.raises(ClarionError, match="another origin"):
            clarion.list_templates()
    assert seen == [("api.example", "Bearer clk_a_b")]


def test_a_next_link_naming_the_same_page_is_refused_rather_than_read_for_ever() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, json=[], headers={"Link": f'<{request.url.raw_path.decode()}>; rel="next"'}
        )

    with Clarion("clk_a_b", "http://api.example", transport=httpx.MockTransport(handler)) as clarion:
        with pytest.raises(ClarionError, match="the page it was on"):
            clarion.list_templates()
