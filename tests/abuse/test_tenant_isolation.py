"""Tenant B's key never reads, changes, cancels or finds tenant A's data, on any route.

The routes come from the app's own OpenAPI document, so a route added later is exercised too: a
route with a path parameter or request body this test does not know fails it, with a message saying
what to teach it. Tenant A first creates one of everything (a sent notification, a user with a
device and preferences, a category, a template, a rate-limit rule, an API key), marked with
strings only A's data contains. Tenant B (every scope) then calls every authenticated route with A's
identifiers, reads first and writes after. No response to B may contain a marker B did not send
itself, no id-addressed read may answer anything but 404, and afterwards A's data is unchanged.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.app import create_app
from harness.services import ApiServer, api_client
from schema.ids import uuid7
from tests.conftest import METRICS_TOKEN, Stack, TenantInfo, make_tenant
from tests.fixtures.delivery import wait_status
from tests.fixtures.sends import email_send

# Routes that take no API key: user-side links carry a signed token (see test_hostile_input) and
# provider webhooks carry the provider's signature. Anything else must be tenant-isolated.
NOT_KEY_AUTHENTICATED = {
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/v1/preferences"),
    ("POST", "/v1/preferences"),
    ("GET", "/v1/unsubscribe"),
    ("POST", "/v1/unsubscribe"),
    ("GET", "/preferences"),
    ("POST", "/v1/webhooks/twilio/status"),
    ("POST", "/v1/webhooks/sendgrid/events"),
    ("POST", "/v1/device/events"),  # the push's signed token names tenant and notification
    ("GET", "/t/o/{token}"),  # email tracking: the signed token names tenant, notification, link
    ("GET", "/t/c/{token}"),
}


@dataclass
class Victim:
    """Tenant A and what it owns."""

    tenant: TenantInfo
    notification_id: str
    event_id: str
    body: dict[str, Any]
    external_id: str
    email: str
    device_token: str
    category: str
    template: str
    template_marker: str
    rule_id: str
    rule_name: str
    key_id: str
    key_name: str
    endpoint_id: str = ""
    endpoint_url: str = ""

    def markers(self) -> dict[str, str]:
        """Strings that appear only in A's data."""
        return {
            "A's notification id": self.notification_id,
            "A's event_id": self.event_id,
            "A's user email": self.email,
            "A's device token": self.device_token,
            "A's template text": self.template_marker,
            "A's rule id": self.rule_id,
            "A's rule name": self.rule_name,
            "A's key id": self.key_id,
            "A's key name": self.key_name,
            "A's category": self.category,
            "A's webhook endpoint id": self.endpoint_id,
            "A's webhook endpoint URL": self.endpoint_url,
        }


async def _ok(response: httpx.Response, *codes: int) -> dict[str, Any]:
    assert response.status_code in (codes or (200, 201, 202)), response.text
    return dict(response.json()) if response.content else {}


async def make_victim(api_url: str, engine: AsyncEngine) -> Victim:
    tenant = await make_tenant(engine)
    tag = secrets.token_hex(4)
    email, token = f"victim-{tag}@a.example.com", secrets.token_hex(32)
    external_id, category, template = f"victim-{tag}", f"cat{tag}", f"tpl{tag}"
    marker = f"only-A-{tag}"
    async with api_client(api_url, tenant.key) as a:
        body = email_send(user={"id": external_id, "email": email}, event_id=f"evt-A-{tag}")
        nid = (await _ok(await a.post("/v1/notifications", json=body)))["id"]
        await wait_status(a, nid, "sent", 30)
        await _ok(await a.post(f"/v1/users/{external_id}/devices", json={"platform": "apns", "token": token}))
        prefs = {"preferences": [{"channel": "sms", "category": "*", "opted_in": False}]}
        await _ok(await a.put(f"/v1/users/{external_id}/preferences", json=prefs))
        await _ok(await a.put(f"/v1/categories/{category}", json={"required": True}))
        template_body = {"name": template, "channel": "email", "subject": marker, "body": f"{marker} body"}
        await _ok(await a.post("/v1/templates", json=template_body))
        rule = {"name": f"rule-{tag}", "scope": "recipient", "channel": "sms", "limit": 7, "period_s": 60}
        rule_id = (await _ok(await a.post("/v1/rate-limits", json=rule)))["id"]
        key = await _ok(await a.post("/v1/keys", json={"name": f"key-{tag}", "scopes": ["read"]}))
    # Straight into the table: this API's SSRF rule refuses every URL a test can listen on.
    endpoint_id, endpoint_url = str(uuid7()), f"http://127.0.0.1:9/victim-{tag}"
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, secret)"
                " VALUES (:i, :t, :u, ARRAY['notification.sent'], 'whsec_AAAA')"
            ),
            {"i": endpoint_id, "t": tenant.id, "u": endpoint_url},
        )
    return Victim(
        tenant, nid, body["event_id"], body, external_id, email, token, category, template, marker,
        str(rule_id), f"rule-{tag}", key["id"], f"key-{tag}", endpoint_id, endpoint_url,
    )  # fmt: skip


def _path_value(victim: Victim, path: str, name: str) -> str:
    values = {
        "notification_id": victim.notification_id,
        "external_id": victim.external_id,
        "token": victim.device_token,
        "rule_id": victim.rule_id,
        "key_id": victim.key_id,
        "channel": "email",
        "endpoint_id": victim.endpoint_id,
    }
    if name == "name":
        return victim.template if path.startswith("/v1/templates") else victim.category
    if name not in values:
        pytest.fail(f"{path}: teach test_tenant_isolation what tenant A's '{{{name}}}' is")
    return values[name]


def _query(victim: Victim, params: list[dict[str, Any]]) -> dict[str, str]:
    known = {"user": victim.external_id, "notification_id": victim.notification_id}
    return {p["name"]: known[p["name"]] for p in params if p["in"] == "query" and p["name"] in known}


def _body(victim: Victim, schema: dict[str, Any] | None) -> Any:
    if schema is None:
        return None
    ref = schema.get("$ref") or next((s["$ref"] for s in schema.get("anyOf", []) if "$ref" in s), "")
    name = ref.rsplit("/", 1)[-1]
    bodies: dict[str, Any] = {
        "NotificationIn": victim.body,  # the same event_id: idempotency keys are per tenant
        "BatchIn": {"notifications": [victim.body]},
        "RedriveFilter": {},
        "UserProfileIn": {"email": "b-took-over@b.example.com"},
        "DeviceIn": {"platform": "apns", "token": secrets.token_hex(32)},  # /v1/users/{id}/devices
        "PreferencesIn": {"preferences": [{"channel": "*", "category": "*", "opted_in": True}]},
        "CategoryIn": {"required": False, "default_opted_in": False},
        "TemplateIn": {"name": victim.template, "channel": "email", "subject": "B", "body": "B's"},
        "ActivateIn": {"channel": "email", "locale": "en", "version": 1},
        "PreviewIn": {"channel": "email", "data": {}},
        "RateLimitIn": {"scope": "recipient", "channel": "sms", "limit": 999, "period_s": 1},
        "TenantSettingsIn": {"content_dedupe_window_s": 60},
        "KeyIn": {"name": "b-key", "scopes": ["read"]},
        "EngagementIn": {"type": "opened"},  # B reporting an open of A's notification
        "EndpointIn": {"url": victim.endpoint_url, "event_types": ["notification.sent"]},
        "EndpointPatch": {"enabled": False, "url": "http://127.0.0.1:9/b"},
        "ReplayIn": {"since": "2026-01-01T00:00:00Z"},
    }
    if name not in bodies:
        pytest.fail(f"teach test_tenant_isolation a body for the request schema '{name}'")
    return bodies[name]


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    """(method, path, operation) for every route in the API's OpenAPI document."""
    from clarion.settings import Settings

    spec = create_app(Settings(env="test", kafka_bootstrap="127.0.0.1:9")).openapi()
    return [
        (method.upper(), path, op)
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
        if (method.upper(), path) not in NOT_KEY_AUTHENTICATED
    ]


async def test_every_route_keeps_tenant_b_out_of_tenant_a(
    stack: Stack, engine: AsyncEngine, client: httpx.AsyncClient
) -> None:
    victim = await make_victim(stack.api.url, engine)
    ops = operations()
    assert len(ops) >= 25, "the route list came out short: is the OpenAPI document complete?"
    # Reads before writes, so a write by B (creating B's own user, say) cannot mask a leaky read.
    ops.sort(key=lambda o: o[0] != "GET")
    leaks: list[str] = []
    for method, path, op in ops:
        params = op.get("parameters", [])
        url = path
        for p in params:
            if p["in"] == "path":
                url = url.replace("{" + p["name"] + "}", _path_value(victim, path, p["name"]))
        schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        body = _body(victim, schema)
        response = await client.request(method, url, params=_query(victim, params), json=body)
        where = f"{method} {path} -> {response.status_code}"
        if response.status_code >= 500:
            leaks.append(f"{where}: server error {response.text[:200]}")
        supplied = f"{url} {_query(victim, params)} {body}"
        for what, marker in victim.markers().items():
            if marker not in supplied and marker in response.text:
                leaks.append(f"{where}: the response shows {what}")
        ids_a_resource = any(p["in"] == "path" and p["name"] != "channel" for p in params)
        if method == "GET" and ids_a_resource and response.status_code != 404:
            leaks.append(f"{where}: expected 404 for A's resource, got {response.text[:200]}")
        if method == "POST" and path in ("/v1/notifications", "/v1/notifications/batch"):
            assert victim.notification_id not in response.text, where
    assert not leaks, "\n".join(leaks)
    await _assert_victim_unchanged(stack.api.url, victim)


async def _assert_victim_unchanged(api_url: str, victim: Victim) -> None:
    async with api_client(api_url, victim.tenant.key) as a:
        note = await _ok(await a.get(f"/v1/notifications/{victim.notification_id}"), 200)
        assert note["status"] == "sent", note
        assert note["engagement"] == [], note  # B's report of an open was refused
        user = await _ok(await a.get(f"/v1/users/{victim.external_id}"), 200)
        assert user["email"] == victim.email, user
        assert victim.device_token in str(user), user
        prefs = await _ok(await a.get(f"/v1/users/{victim.external_id}/preferences"), 200)
        assert "False" in str(prefs) or "false" in str(prefs).lower(), prefs
        category = await _ok(await a.get(f"/v1/categories/{victim.category}"), 200)
        assert category["required"] is True, category
        versions = (await a.get(f"/v1/templates/{victim.template}")).json()
        assert all(victim.template_marker in str(v) for v in versions), versions
        rule = await _ok(await a.get(f"/v1/rate-limits/{victim.rule_id}"), 200)
        assert rule["limit"] == 7, rule
        keys = {k["id"]: k for k in (await a.get("/v1/keys")).json()}
        assert keys[victim.key_id]["revoked_at"] is None, keys[victim.key_id]
        endpoint = await _ok(await a.get(f"/v1/webhook-endpoints/{victim.endpoint_id}"), 200)
        assert (endpoint["enabled"], endpoint["url"]) == (True, victim.endpoint_url), endpoint
        search = (await a.get("/v1/notifications", params={"user": victim.external_id})).json()
        assert [i["id"] for i in search["items"]] == [victim.notification_id], search


async def test_metrics_do_not_show_tenants_to_a_caller_without_the_metrics_token(
    api: ApiServer, client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    """The API's series name every tenant: neither an anonymous caller nor a tenant's own admin
    key reads them; the scraper's token does."""
    assert (await client.post("/v1/notifications", json=email_send())).status_code == 202
    assert "admin" in (await client.get("/v1/keys")).text  # the tenant's own key is an admin key
    for key in (None, tenant.key, "not-the-token"):
        async with api_client(api.url, key) as caller:
            response = await caller.get("/metrics")
        assert response.status_code == 401, (key, response.text)
        assert response.json()["error"]["code"] == "unauthorized"
        assert tenant.id not in response.text
    async with api_client(api.url, METRICS_TOKEN) as scraper:
        response = await scraper.get("/metrics")
    assert response.status_code == 200
    assert tenant.id in response.text
