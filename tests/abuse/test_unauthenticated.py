"""Nothing an unauthenticated caller sends grows the API's memory or is parsed."""

from __future__ import annotations

import json

import httpx
import pytest

from api.auth import KeyCache
from harness.services import ApiServer
from tests.fixtures.answers import refused
from tests.fixtures.sends import email_send


def key_cache(api: ApiServer) -> KeyCache:
    cache = api.app.state.key_cache
    assert isinstance(cache, KeyCache)
    return cache


@pytest.mark.parametrize(
    "key",
    ["clk_a_" + "x" * 2_000_000, "clk_a_" + "x" * 300, "not-a-key", "clk__secret", "clk_id_", "Bearer"],
)
async def test_a_key_not_in_the_key_shape_is_refused_without_a_lookup_or_a_cache_entry(
    api: ApiServer, key: str
) -> None:
    cache = key_cache(api)
    before = len(cache)
    async with httpx.AsyncClient(base_url=api.url, timeout=15) as c:
        response = await c.get("/v1/notifications", headers={"Authorization": f"Bearer {key}"})
    refused(response, 401, 431)
    assert len(cache) == before


async def test_unknown_keys_of_the_right_shape_are_cached_by_digest_and_bounded() -> None:
    cache = KeyCache(ttl_s=60, max_entries=100)
    for n in range(1_000):
        await cache.resolve(f"clk_{n}_{'s' * 150}", _none)
    assert len(cache) == 100
    assert all(len(digest) == 32 for digest in cache._entries)


async def test_expired_entries_are_dropped() -> None:
    cache = KeyCache(ttl_s=-1, max_entries=100)
    for n in range(10):
        await cache.resolve(f"clk_{n}_secret", _none)
    assert len(cache) == 1  # each store drops every expired entry before it


async def _none() -> None:
    return None


async def test_request_headers_over_16_kib_are_a_431(api: ApiServer) -> None:
    async with httpx.AsyncClient(base_url=api.url, timeout=15) as c:
        response = await c.get("/healthz", headers={"X-Padding": "x" * 20_000})
    refused(response, 431)


@pytest.mark.parametrize("path", ["/v1/notifications", "/v1/notifications/batch"])
async def test_an_unauthenticated_send_is_refused_before_its_body_is_parsed(
    api: ApiServer, path: str
) -> None:
    async with httpx.AsyncClient(base_url=api.url, timeout=15) as c:
        response = await c.post(
            path, content=b"{not json at all", headers={"Content-Type": "application/json"}
        )
    assert refused(response, 401)["code"] == "unauthorized"  # not malformed_json: never parsed


@pytest.mark.parametrize("path", ["/v1/notifications", "/v1/notifications/batch"])
async def test_a_send_that_is_not_json_is_a_415(client: httpx.AsyncClient, path: str) -> None:
    body = email_send() if path.endswith("notifications") else {"notifications": [email_send()]}
    response = await client.post(path, content=json.dumps(body), headers={"Content-Type": "text/plain"})
    refused(response, 415)
