"""Concurrent sends share transactions (group commit), yet each caller gets the answer it would
have had alone, and a refused send leaves nothing behind."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.conftest import TenantInfo
from tests.fixtures.db import scalar
from tests.fixtures.sends import count_notifications, email_send


async def _users(engine: AsyncEngine, tenant_id: str) -> set[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            sa.text("SELECT external_id FROM users WHERE tenant_id = :t"), {"t": tenant_id}
        )
        return {r[0] for r in rows}


async def test_each_concurrent_send_gets_its_own_answer(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    def user(name: str) -> dict[str, Any]:
        return {"id": name, "email": f"{name}@example.com"}

    good = [email_send(user=user(f"good-{i}")) for i in range(30)]
    bad: list[tuple[dict[str, Any], int, str]] = [
        (email_send(user=user(f"novar-{i}"), data={}), 422, "missing_template_variable") for i in range(4)
    ]
    # a NUL the database refuses, in data no template part uses (a NUL in a subject is unsafe_template)
    bad += [(email_send(user=user("nul"), data={"order_id": "1", "note": "a\u0000b"}), 422, "invalid_value")]
    bad += [(email_send(user=None, user_id=f"ghost-{i}"), 422, "unknown_user") for i in range(3)]
    bad += [(email_send(user=user("notpl"), template="no_such_template"), 422, "unknown_template")]
    bodies = good + [b for b, _, _ in bad]
    responses = await asyncio.gather(*(client.post("/v1/notifications", json=b) for b in bodies))

    accepted = responses[: len(good)]
    assert [r.status_code for r in accepted] == [202] * len(good), [r.text for r in accepted]
    assert len({r.json()["id"] for r in accepted}) == len(good)
    for response, (_, status, code) in zip(responses[len(good) :], bad, strict=True):
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code
    assert await count_notifications(engine, tenant.id) == len(good)
    # Refused sends wrote nothing: not even the users they carried.
    assert await _users(engine, tenant.id) == {f"good-{i}" for i in range(30)}
    for response in accepted[:3]:
        read = await client.get(f"/v1/notifications/{response.json()['id']}")
        assert read.status_code == 200 and read.json()["event_id"] in {b["event_id"] for b in good}


async def test_concurrent_repeats_of_an_event_id_are_accepted_once(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    body = email_send()
    responses = await asyncio.gather(*(client.post("/v1/notifications", json=body) for _ in range(12)))
    assert sorted(r.status_code for r in responses) == [200] * 11 + [202]
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(r.json()["duplicate"] for r in responses) == 11
    assert await count_notifications(engine, tenant.id) == 1


async def test_concurrent_different_bodies_for_one_event_id_accept_one_and_refuse_the_rest(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    event_id = f"evt-{secrets.token_hex(6)}"
    bodies = [email_send(event_id=event_id, data={"order_id": str(i)}) for i in range(8)]
    responses = await asyncio.gather(*(client.post("/v1/notifications", json=b) for b in bodies))
    assert sorted(r.status_code for r in responses) == [202] + [409] * 7
    winner = next(r.json()["id"] for r in responses if r.status_code == 202)
    assert all(r.json()["error"]["details"]["id"] == winner for r in responses if r.status_code == 409)
    assert await count_notifications(engine, tenant.id) == 1


async def test_concurrent_sends_to_one_user_create_it_once(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    bodies = [
        email_send(user={"id": "shared", "email": f"v{i}@example.com", "locale": "en"}) for i in range(10)
    ]
    responses = await asyncio.gather(*(client.post("/v1/notifications", json=b) for b in bodies))
    assert [r.status_code for r in responses] == [202] * 10
    assert await _users(engine, tenant.id) == {"shared"}
    email = await scalar(
        engine, "SELECT email FROM users WHERE tenant_id = :t AND external_id = 'shared'", t=tenant.id
    )
    assert email in {f"v{i}@example.com" for i in range(10)}
    users_of_sends = "SELECT count(DISTINCT user_id) FROM notifications WHERE tenant_id = :t"
    assert await scalar(engine, users_of_sends, t=tenant.id) == 1


async def test_inline_details_update_the_user_and_repeating_them_writes_nothing(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    async def row_version() -> str:
        query = "SELECT xmin::text FROM users WHERE tenant_id = :t AND external_id = 'ada'"
        return str(await scalar(engine, query, t=tenant.id))

    first = {"id": "ada", "email": "ada@example.com", "phone": "+14155550100", "timezone": "Europe/Paris"}
    assert (await client.post("/v1/notifications", json=email_send(user=first))).status_code == 202
    created = (await client.get("/v1/users/ada")).json()
    version = await row_version()

    # The same details, or fewer of them, change nothing: not even the row's version.
    for user in (first, {"id": "ada", "email": "ada@example.com"}):
        assert (await client.post("/v1/notifications", json=email_send(user=user))).status_code == 202
    assert (await client.get("/v1/users/ada")).json() == created
    assert await row_version() == version

    # A new detail is applied; the ones left out keep their values.
    changed = {"id": "ada", "email": "ada@lovelace.dev"}
    assert (await client.post("/v1/notifications", json=email_send(user=changed))).status_code == 202
    now = (await client.get("/v1/users/ada")).json()
    assert (now["email"], now["phone"], now["timezone"]) == (
        "ada@lovelace.dev",
        "+14155550100",
        "Europe/Paris",
    )
    assert now["updated_at"] > created["updated_at"]


LOOP_BOMB = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


async def test_a_repeat_is_answered_as_a_repeat_after_its_tenant_spent_its_render_share(
    client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    # Inline content renders before the send joins a shared transaction; its outcome travels
    # with the send, so the checks keep their order: an earlier event id is found first.
    inline = {"content": {"subject": "Hi {{ n }}", "body": "n={{ n }}"}, "data": {"n": 1}}
    body = email_send(template=None, **inline)
    del body["template"]
    first = await client.post("/v1/notifications", json=body)
    assert first.status_code == 202, first.text
    bomb = {**body, "content": {"subject": "s", "body": LOOP_BOMB}}
    messages: list[str] = []
    for i in range(40):  # each bomb spends up to 2 x 200 ms of the tenant's render CPU
        refused = await client.post("/v1/notifications", json={**bomb, "event_id": f"bomb-{i}"})
        assert refused.status_code == 422, refused.text
        messages.append(refused.json()["error"]["message"])
        if "share of render time" in messages[-1]:
            break
    assert "share of render time" in messages[-1], messages
    # Sent within milliseconds of that refusal, while the share is still spent.
    again = await client.post("/v1/notifications", json=body)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
