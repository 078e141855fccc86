"""Identifiers a tenant chooses hold printable characters (``clarion/printable_ids.py``).

Until 2026-11-29 the API took any characters in event ids and user ids: an escape sequence, a bidi
override, a zero-width space went into logs, CSV exports, terminals and dashboards downstream as
they came. A new one is now a 422 ``validation_error`` naming the field, and nothing is stored.
Ordinary printable Unicode stays valid, and an id stored before the rule keeps working wherever
it names what is stored: no tenant is locked out of its own users or sends.
"""

from __future__ import annotations

import secrets
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from schema.ids import uuid7
from tests.conftest import TenantInfo
from tests.fixtures.answers import assert_error
from tests.fixtures.db import scalar
from tests.fixtures.sends import count_notifications, email_send, stored_as_before

HOSTILE_IDS = [
    "order-1\x1b]52;c;Y3VybA==\x07",  # OSC 52: writes the reader's clipboard (Cc)
    "u-\u202egnp.exe",  # a bidi override: reads as "u-exe.png" (Cf)
    "ada\u200b@example.com",  # zero width: two ids that read the same (Cf)
    "x\x9b2J",  # C1 CSI: clears the screen of terminals that honour it (Cc)
    "line\u2028forged",  # a line separator breaks a log line as \n does (Zl)
    "\ue000private",  # private use (Co)
    "un\u0378assigned",  # unassigned (Cn)
    "tab\there",
    " leading-space",
    "trailing-space ",
]
# What tenants use today, and keep using: emails, UUIDs, names in many scripts, spaces inside.
PRINTABLE_IDS = [
    "ada@example.com",
    "6f1c2b8e-3d4a-4c1e-9b7a-2f0e8d6c5a41",
    "Ada Lovelace",
    "Łukasz Żółć",
    "山田太郎",
    "محمد علي",
    "Ελένη",
    "user\u00a0nbsp",  # a no-break space inside
    "fan 😀",
    "x'; DROP TABLE users; --",
]


def user_path(external_id: str, rest: str = "") -> str:
    return f"/v1/users/{quote(external_id, safe='')}{rest}"


async def users_named(engine: AsyncEngine, tenant: TenantInfo, external_id: str) -> int:
    sql = "SELECT count(*) FROM users WHERE tenant_id = :t AND external_id = :e"
    return int(await scalar(engine, sql, t=tenant.id, e=external_id))


@pytest.mark.parametrize("hostile", HOSTILE_IDS, ids=ascii)
async def test_a_send_with_a_new_unprintable_event_id_is_a_422_and_nothing_is_stored(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, hostile: str
) -> None:
    error = assert_error(
        await client.post("/v1/notifications", json=email_send(event_id=hostile)), 422, "validation_error"
    )
    assert error["details"][0]["field"] == "event_id"
    assert hostile not in error["message"] or hostile.isprintable()  # quoted escaped, if at all
    assert await count_notifications(engine, tenant.id) == 0


@pytest.mark.parametrize("hostile", HOSTILE_IDS, ids=ascii)
async def test_a_send_creating_a_user_with_an_unprintable_id_is_a_422_and_no_user_is_made(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, hostile: str
) -> None:
    body = email_send(user={"id": hostile, "email": "ada@example.com"})
    error = assert_error(await client.post("/v1/notifications", json=body), 422, "validation_error")
    assert error["details"][0]["field"] == "user.id"
    assert await count_notifications(engine, tenant.id) == 0
    assert await users_named(engine, tenant, hostile) == 0


async def test_a_batch_refuses_only_its_items_with_unprintable_ids(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    items = [
        email_send(),
        email_send(event_id="evt-\u202e1"),
        email_send(user={"id": "u-\x1b[2J", "email": "ada@example.com"}),
        email_send(user={"id": "Łukasz Żółć", "email": "lz@example.com"}),
    ]
    response = await client.post("/v1/notifications/batch", json={"notifications": items})
    assert response.status_code == 202, response.text
    body = response.json()
    assert (body["accepted"], body["rejected"]) == (2, 2)
    refused = {r["index"]: r["error"] for r in body["results"] if r.get("error")}
    assert sorted(refused) == [1, 2]
    assert [refused[i]["code"] for i in (1, 2)] == ["validation_error"] * 2
    assert [refused[i]["details"][0]["field"] for i in (1, 2)] == ["event_id", "user.id"]
    assert await count_notifications(engine, tenant.id) == 2
    assert await users_named(engine, tenant, "u-\x1b[2J") == 0


@pytest.mark.parametrize("hostile", HOSTILE_IDS, ids=ascii)
async def test_put_user_with_a_new_unprintable_id_is_a_422_and_creates_nothing(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo, hostile: str
) -> None:
    response = await client.put(user_path(hostile), json={"email": "ada@example.com"})
    error = assert_error(response, 422, "validation_error")
    assert error["details"][0]["field"] == "external_id"
    assert await users_named(engine, tenant, hostile) == 0
    # The routes that only name a user (devices, preferences) never created one: still a 404.
    device = {"platform": "apns", "token": secrets.token_hex(32)}
    assert_error(await client.post(user_path(hostile, "/devices"), json=device), 404, "unknown_user")
    assert_error(await client.put(user_path(hostile, "/preferences"), json={"preferences": []}), 404, "unknown_user")  # fmt: skip
    assert_error(await client.post(user_path(hostile, "/preferences/link")), 404, "unknown_user")


@pytest.mark.parametrize("name", ["ops ", " ops", "ops\t", "ops\u202e", "ops\x1b"], ids=ascii)
async def test_an_api_key_name_with_edge_whitespace_or_controls_is_a_422(
    client: httpx.AsyncClient, name: str
) -> None:
    before = len((await client.get("/v1/keys")).json())
    error = assert_error(
        await client.post("/v1/keys", json={"name": name, "scopes": ["send"]}), 422, "validation_error"
    )
    assert error["details"][0]["field"] == "name"
    assert len((await client.get("/v1/keys")).json()) == before
    created = await client.post("/v1/keys", json={"name": "ops key", "scopes": ["send"]})
    assert created.status_code == 201, created.text


@pytest.mark.parametrize("external_id", PRINTABLE_IDS, ids=ascii)
async def test_printable_ids_in_any_script_are_still_accepted_everywhere(
    client: httpx.AsyncClient, external_id: str
) -> None:
    created = await client.put(user_path(external_id), json={"email": "ada@example.com"})
    assert created.status_code == 201, created.text
    assert (await client.get(user_path(external_id))).json()["id"] == external_id
    body = email_send(event_id=f"{external_id}-{secrets.token_hex(2)}", user={"id": external_id})
    assert (await client.post("/v1/notifications", json=body)).status_code == 202


STORED = "u-\u202egnp.exe\x1b[2J"  # a user id the API took before 2026-11-29 (README, "Hostile input")


async def stored_before_the_rule(engine: AsyncEngine, tenant: TenantInfo, external_id: str) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            sa.text(
                "INSERT INTO users (id, tenant_id, external_id, email, phone)"
                " VALUES (:id, :t, :e, 'ada@example.com', '+14155550100')"
            ),
            {"id": uuid7(), "t": tenant.id, "e": external_id},
        )


async def test_a_user_stored_before_the_rule_is_still_read_updated_and_sent_to(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    await stored_before_the_rule(engine, tenant, STORED)

    assert (await client.get(user_path(STORED))).json()["id"] == STORED
    updated = await client.put(user_path(STORED), json={"email": "grace@example.com"})
    assert updated.status_code == 200, updated.text  # updated, not created
    device = {"platform": "apns", "token": secrets.token_hex(32)}
    assert (await client.post(user_path(STORED, "/devices"), json=device)).status_code == 201
    prefs = {"preferences": [{"channel": "sms", "category": "*", "opted_in": False}]}
    assert (await client.put(user_path(STORED, "/preferences"), json=prefs)).status_code == 200
    assert (await client.get(user_path(STORED, "/preferences"))).status_code == 200
    assert (await client.post(user_path(STORED, "/preferences/link"))).status_code == 200

    by_id = await client.post("/v1/notifications", json=email_send(user=None, user_id=STORED))
    assert by_id.status_code == 202, by_id.text
    inline = await client.post("/v1/notifications", json=email_send(user={"id": STORED, "email": "grace@example.com"}))  # fmt: skip
    assert inline.status_code == 202, inline.text
    found = (await client.get("/v1/notifications", params={"user": STORED})).json()["items"]
    assert sorted(i["id"] for i in found) == sorted([by_id.json()["id"], inline.json()["id"]])
    assert await users_named(engine, tenant, STORED) == 1


async def test_a_repeat_of_an_event_id_stored_before_the_rule_still_answers_as_a_repeat(
    client: httpx.AsyncClient, engine: AsyncEngine, tenant: TenantInfo
) -> None:
    first = email_send()
    accepted = await client.post("/v1/notifications", json=first)
    assert accepted.status_code == 202, accepted.text
    nid = accepted.json()["id"]
    repeat: dict[str, Any] = {**first, "event_id": "order-1\x1b[2J\u202e"}
    await stored_as_before(engine, nid, repeat)

    again = await client.post("/v1/notifications", json=repeat)
    assert again.status_code == 200, again.text
    assert again.json()["id"] == nid
    assert (await client.get(f"/v1/notifications/{nid}")).json()["event_id"] == repeat["event_id"]
