"""API keys: stored hashed, shown once, rotated without a gap, and refused within seconds of revocation."""

from __future__ import annotations

import hashlib

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from api.auth import CACHE_TTL_S
from api.keys import MAX_REVOKED_SHOWN
from clarion import tenants
from clarion.tenants import create_api_key, split_key
from harness.services import ApiServer, api_client, wait_until
from tests.conftest import TenantInfo, make_tenant


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_a_created_key_is_shown_once_and_stored_only_as_a_hash(
    client: httpx.AsyncClient, engine: AsyncEngine
) -> None:
    created = await client.post("/v1/keys", json={"name": "ci", "scopes": ["send", "read"]})
    assert created.status_code == 201, created.text
    key = created.json()["key"]
    key_id, secret = created.json()["id"], key.split("_", 2)[2]
    async with engine.connect() as conn:
        row = (
            (await conn.execute(sa.text("SELECT * FROM api_keys WHERE id = :i"), {"i": key_id}))
            .mappings()
            .one()
        )
    assert row["secret_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert all(secret not in str(value) for value in row.values())
    listed = (await client.get("/v1/keys")).text
    assert key_id in listed and secret not in listed and row["secret_hash"] not in listed
    assert sorted(created.json()["scopes"]) == ["read", "send"]


async def test_rotation_keeps_the_new_key_working_and_the_revoked_one_is_refused_within_the_cache_ttl(
    api: ApiServer, client: httpx.AsyncClient
) -> None:
    old = (await client.post("/v1/keys", json={"name": "old", "scopes": ["read"]})).json()
    new = (await client.post("/v1/keys", json={"name": "new", "scopes": ["read"]})).json()
    async with httpx.AsyncClient(base_url=api.url, timeout=10) as c:
        # The old key is in use (and so in the API's auth cache) when it is revoked.
        assert (await c.get("/v1/templates", headers=_bearer(old["key"]))).status_code == 200
        revoked = await client.post(f"/v1/keys/{old['id']}/revoke")
        assert revoked.status_code == 200 and revoked.json()["revoked_at"], revoked.text

        async def refused() -> bool:
            return (await c.get("/v1/templates", headers=_bearer(old["key"]))).status_code == 401

        await wait_until(refused, timeout_s=CACHE_TTL_S + 1.0, interval_s=0.2)  # else a revoked key works
        assert (await c.get("/v1/templates", headers=_bearer(new["key"]))).status_code == 200
    again = await client.post(f"/v1/keys/{old['id']}/revoke")
    assert again.json()["revoked_at"] == revoked.json()["revoked_at"]  # idempotent: the first time stays


async def test_only_an_admin_key_manages_keys(api: ApiServer, engine: AsyncEngine) -> None:
    sender = await make_tenant(engine, scopes=("send", "read"))
    async with httpx.AsyncClient(base_url=api.url, headers=_bearer(sender.key), timeout=10) as c:
        for response in (
            await c.get("/v1/keys"),
            await c.post("/v1/keys", json={"scopes": ["admin"]}),
            await c.post(f"/v1/keys/{sender.key.split('_')[1]}/revoke"),
        ):
            assert response.status_code == 403, response.text
            assert response.json()["error"]["code"] == "forbidden"


async def test_bad_key_requests_are_refused_with_the_error_shape(
    client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    bodies: list[dict[str, object]] = [
        {"scopes": []},
        {"scopes": ["root"]},
        {"scopes": ["read"], "name": "x" * 65},
        {"scopes": "read"},
    ]
    for body in bodies:
        response = await client.post("/v1/keys", json=body)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] == "validation_error"
    missing = await client.post("/v1/keys/doesnotexist/revoke")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_the_key_list_shows_every_unrevoked_key_and_only_the_newest_revoked_ones(
    client: httpx.AsyncClient, tenant: TenantInfo, engine: AsyncEngine
) -> None:
    """A key created and revoked in a loop is two cheap calls that the unrevoked cap never sees;
    before, every revoked key stayed in ``GET /v1/keys``: 1,312 such keys in 30 s made it 180 KB,
    and four loops listing them took another tenant's p99 from 16 to 430 ms (a probe, 2026-11-30)."""
    extra = MAX_REVOKED_SHOWN + 20
    async with engine.begin() as conn:
        for n in range(extra):
            key = await create_api_key(conn, tenant_id=tenant.id, scopes=("send",), name=f"old{n}")
            await conn.execute(
                sa.text("UPDATE api_keys SET revoked_at = now() - make_interval(secs => :s) WHERE id = :i"),
                {"s": extra - n, "i": key.split("_")[1]},
            )
        kept = split_key(await create_api_key(conn, tenant_id=tenant.id, scopes=("read",), name="kept"))
    listed = (await client.get("/v1/keys")).json()  # rows stored before creates pruned them
    revoked = {k["name"] for k in listed if k["revoked_at"] is not None}
    assert revoked == {f"old{n}" for n in range(extra - MAX_REVOKED_SHOWN, extra)}
    unrevoked = [k["id"] for k in listed if k["revoked_at"] is None]
    assert len(unrevoked) == 2 and kept is not None and kept[0] in unrevoked  # the tenant's own, the new one


async def test_a_new_key_whose_drawn_id_is_taken_never_takes_over_the_existing_key(
    client: httpx.AsyncClient, api: ApiServer, engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Key ids are 48 random bits: a tenant creating keys in a loop draws, now and then, one
    another tenant's key already has. The store was an upsert on the id (for ``clarion keys``
    storing a given key), so such a create moved that key to the creating tenant with its new
    secret, and the other tenant's key stopped working."""
    victim = await make_tenant(engine)
    taken_id = split_key(victim.key)[0]  # type: ignore[index]
    drawn = iter([taken_id, "0123456789ab"])
    monkeypatch.setattr(tenants.secrets, "token_hex", lambda _n: next(drawn))
    created = await client.post("/v1/keys", json={"name": "mine", "scopes": ["admin"]})
    monkeypatch.undo()
    assert created.status_code == 201, created.text
    assert created.json()["id"] == "0123456789ab"
    async with api_client(api.url, victim.key) as v:
        assert (await v.get("/v1/keys")).status_code == 200


async def test_creating_a_key_deletes_the_revoked_keys_past_the_newest_ones_kept(
    client: httpx.AsyncClient, tenant: TenantInfo, engine: AsyncEngine
) -> None:
    """Revoked keys are rows nothing reads but the listing: a create-and-revoke loop grew the
    shared table by a row per two calls, for ever. A user's retired devices are pruned alike."""
    async with engine.begin() as conn:
        for n in range(MAX_REVOKED_SHOWN + 5):
            key = await create_api_key(conn, tenant_id=tenant.id, scopes=("send",), name=f"old{n}")
            await conn.execute(
                sa.text("UPDATE api_keys SET revoked_at = now() - make_interval(secs => :s) WHERE id = :i"),
                {"s": 1000 - n, "i": split_key(key)[0]},  # type: ignore[index]
            )
    assert (await client.post("/v1/keys", json={"name": "new", "scopes": ["read"]})).status_code == 201
    async with engine.connect() as conn:
        names = (
            await conn.execute(
                sa.text("SELECT name FROM api_keys WHERE tenant_id = :t AND revoked_at IS NOT NULL"),
                {"t": tenant.id},
            )
        ).scalars()
        assert set(names) == {f"old{n}" for n in range(5, MAX_REVOKED_SHOWN + 5)}
