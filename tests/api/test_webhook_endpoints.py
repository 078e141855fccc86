"""/v1/webhook-endpoints: register (secret once), read, change, rotate, delete, replay; every URL
through the SSRF rule; hostile input answered 4xx with the error body."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.settings import Settings
from harness.services import ApiServer
from harness.tenants import make_tenant
from tests.fixtures.webhooks import register


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error"]["code"] == code, body
    return dict(body)


async def test_the_secret_is_shown_once_and_the_endpoint_reads_back(local: httpx.AsyncClient) -> None:
    created = await register(local, "http://127.0.0.1:9/hooks", ["notification.sent", "notification.sent"])
    assert created["secret"].startswith("whsec_")
    assert created["event_types"] == ["notification.sent"]
    assert created["enabled"] is True and created["disabled_reason"] is None
    read = (await local.get(f"/v1/webhook-endpoints/{created['id']}")).json()
    assert "secret" not in read and read["url"] == "http://127.0.0.1:9/hooks"
    listed = (await local.get("/v1/webhook-endpoints")).json()
    assert [e["id"] for e in listed] == [created["id"]] and "secret" not in listed[0]


async def test_rotation_gives_a_new_secret_and_keeps_the_old_one_signing_a_day(
    local: httpx.AsyncClient,
) -> None:
    created = await register(local, "http://127.0.0.1:9/hooks")
    rotated = await local.post(f"/v1/webhook-endpoints/{created['id']}/rotate-secret")
    assert rotated.status_code == 200, rotated.text
    assert rotated.json()["secret"] != created["secret"]
    assert rotated.json()["previous_valid_until"] > created["created_at"]


async def test_patch_changes_fields_and_enabling_clears_a_disabled_reason(
    local: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    import sqlalchemy as sa

    created = await register(local, "http://127.0.0.1:9/hooks")
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "UPDATE webhook_endpoints SET enabled = false, disabled_reason = 'x', failure_streak = 9 WHERE id = :i"
            ),
            {"i": created["id"]},
        )
    path = f"/v1/webhook-endpoints/{created['id']}"
    changed = await local.patch(path, json={"enabled": True, "event_types": ["notification.opened"]})
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert (body["enabled"], body["disabled_reason"], body["failure_streak"]) == (True, None, 0)
    assert body["event_types"] == ["notification.opened"]
    assert (await local.delete(path)).status_code == 204
    _error(await local.get(path), 404, "not_found")


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("http://127.0.0.1/", "url_not_allowed"),
        ("http://[::1]/", "url_not_allowed"),
        ("http://[3fff::1]/", "url_not_allowed"),
        ("http://169.254.169.254/latest/meta-data/", "url_not_allowed"),
        ("http://10.0.0.1/", "url_not_allowed"),
        ("http://localhost:8000/", "url_not_allowed"),
        ("http://2130706433/", "url_not_allowed"),
        ("ftp://example.com/", "url_invalid"),
        ("file:///etc/passwd", "url_invalid"),
        ("http://user:pw@example.com/", "url_invalid"),
        ("http://no-such-host.invalid/", "url_unresolvable"),
    ],
)
async def test_a_url_reaching_inside_is_refused_at_registration(
    client: httpx.AsyncClient, url: str, code: str
) -> None:
    body = _error(
        await client.post("/v1/webhook-endpoints", json={"url": url, "event_types": ["notification.sent"]}),
        422,
        code,
    )
    assert body["error"]["details"] == {"field": "url"}


async def test_a_url_changed_to_reach_inside_is_refused(
    client: httpx.AsyncClient, local: httpx.AsyncClient
) -> None:
    created = await register(local, "http://127.0.0.1:9/hooks")
    # The same tenant, through the API without the allow-list: the change is checked too.
    response = await client.patch(f"/v1/webhook-endpoints/{created['id']}", json={"url": "http://[::1]:9/"})
    _error(response, 422, "url_not_allowed")


@pytest.mark.parametrize(
    "body",
    [
        {"url": "http://example.com/" + "a" * 10_000, "event_types": ["notification.sent"]},
        {"url": "http://127.0.0.1/", "event_types": []},
        {"url": "http://127.0.0.1/", "event_types": ["notification.exploded"]},
        {"url": "http://127.0.0.1/", "event_types": "notification.sent"},
        {"url": 5, "event_types": ["notification.sent"]},
        {"url": "http://127.0.0.1/", "event_types": ["notification.sent"], "secret": "whsec_mine"},
        {"event_types": ["notification.sent"]},
    ],
)
async def test_malformed_bodies_are_validation_errors(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    _error(await client.post("/v1/webhook-endpoints", json=body), 422, "validation_error")


async def test_a_tenant_holds_at_most_the_configured_number_of_endpoints(
    local: httpx.AsyncClient, settings: Settings
) -> None:
    for _ in range(settings.max_webhook_endpoints_per_tenant):
        await register(local, "http://127.0.0.1:9/hooks")
    response = await local.post(
        "/v1/webhook-endpoints", json={"url": "http://127.0.0.1:9/", "event_types": ["notification.sent"]}
    )
    _error(response, 409, "limit_reached")


async def test_another_tenants_endpoint_is_not_found(
    local: httpx.AsyncClient, local_api: ApiServer, engine: AsyncEngine
) -> None:
    theirs = await register(local, "http://127.0.0.1:9/hooks")
    other = await make_tenant(engine)
    async with httpx.AsyncClient(
        base_url=local_api.url, headers={"Authorization": f"Bearer {other.key}"}, timeout=15
    ) as mine:
        path = f"/v1/webhook-endpoints/{theirs['id']}"
        _error(await mine.get(path), 404, "not_found")
        _error(await mine.patch(path, json={"enabled": False}), 404, "not_found")
        _error(await mine.delete(path), 404, "not_found")
        _error(await mine.post(f"{path}/rotate-secret"), 404, "not_found")
        _error(await mine.post(f"{path}/replay", json={"since": "2026-01-01T00:00:00Z"}), 404, "not_found")
        _error(await mine.get(f"{path}/deliveries"), 404, "not_found")
        assert (await mine.get("/v1/webhook-endpoints")).json() == []
    assert (await local.get(path)).json()["enabled"] is True


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"since": "2026-11-25T09:00:00Z", "event_id": "01936f0e-0000-7000-8000-000000000001"},
        {"since": "2026-11-25T09:00:00"},  # no offset
        {"since": "yesterday"},
        {"event_id": "not-a-uuid"},
    ],
)
async def test_a_malformed_replay_is_a_validation_error(
    local: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    created = await register(local, "http://127.0.0.1:9/hooks")
    _error(
        await local.post(f"/v1/webhook-endpoints/{created['id']}/replay", json=body), 422, "validation_error"
    )


async def test_replaying_an_unknown_event_is_not_found_and_a_disabled_endpoint_refuses(
    local: httpx.AsyncClient,
) -> None:
    created = await register(local, "http://127.0.0.1:9/hooks")
    path = f"/v1/webhook-endpoints/{created['id']}"
    for event_id in ("01936f0e-0000-7000-8000-000000000001", "9b2e2a4c-1b7a-4c1e-8f55-0a4c2b3d4e5f"):
        _error(await local.post(f"{path}/replay", json={"event_id": event_id}), 404, "not_found")
    await local.patch(path, json={"enabled": False})
    _error(
        await local.post(f"{path}/replay", json={"since": "2026-01-01T00:00:00Z"}), 409, "endpoint_disabled"
    )


async def test_a_send_only_key_cannot_manage_endpoints(local_api: ApiServer, engine: AsyncEngine) -> None:
    sender = await make_tenant(engine, scopes=("send",))
    async with httpx.AsyncClient(
        base_url=local_api.url, headers={"Authorization": f"Bearer {sender.key}"}, timeout=15
    ) as c:
        _error(await c.get("/v1/webhook-endpoints"), 403, "forbidden")
