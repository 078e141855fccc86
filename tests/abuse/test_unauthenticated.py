"""Nothing an unauthenticated caller sends grows the API's memory or is parsed."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest

from api.auth import KeyCache
from api.head_limit import HEAD_LIMIT_BYTES
from harness.services import ApiServer, wait_until
from tests.fixtures.answers import refused
from tests.fixtures.sends import email_send


def key_cache(api: ApiServer) -> KeyCache:
    cache = api.app.state.key_cache
    assert isinstance(cache, KeyCache)
    return cache


@pytest.mark.parametrize(
    "key",
    ["clk_a_" + "x" * 10_000, "clk_a_" + "x" * 300, "not-a-key", "clk__secret", "clk_id_", "Bearer"],
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


async def raw_exchange(api: ApiServer, *pieces: bytes) -> tuple[bytes, bytes]:
    """Write ``pieces`` one after the other on a fresh connection; the answer's head and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", api.settings.api_port)
    try:
        for piece in pieces:
            writer.write(piece)
            await writer.drain()
        head, _, body = (await asyncio.wait_for(reader.read(), timeout=10)).partition(b"\r\n\r\n")
    finally:
        writer.close()
    return head, body


async def test_an_oversized_head_is_refused_while_it_is_still_arriving(api: ApiServer) -> None:
    """A 2 MB header used to be read and parsed whole before the 431 (each such request held the
    API's loop for milliseconds): now the answer comes once 32 KiB arrived, the head unfinished."""
    head, body = await raw_exchange(
        api,
        b"GET /v1/notifications HTTP/1.1\r\nHost: clarion\r\nAuthorization: Bearer clk_a_",
        b"x" * (HEAD_LIMIT_BYTES + 1),  # no end of line, no end of head
    )
    assert head.startswith(b"HTTP/1.1 431 "), head
    assert json.loads(body)["error"]["code"] == "headers_too_large"


async def test_a_request_httptools_cannot_parse_gets_the_error_shape(api: ApiServer) -> None:
    """A request line past ~64 KB (or any unparsable request): uvicorn answered in plain text."""
    head, body = await raw_exchange(
        api, b"GET /t/o/" + b"%F1%AC%BF%A9" * 6_000 + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    assert head.startswith(b"HTTP/1.1 400 "), head
    assert json.loads(body)["error"]["code"] == "bad_request"


async def test_a_head_under_the_limit_that_arrives_in_pieces_is_served(api: ApiServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", api.settings.api_port)
    try:
        for piece in (b"GET /healthz HTTP/1.1\r\n", b"Host: clarion\r\n", b"X-Padding: " + b"x" * 8_000):
            writer.write(piece)
            await writer.drain()
        writer.write(b"\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


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


async def test_a_client_leaving_mid_body_is_no_error(
    api: ApiServer, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """wrk stopping mid-request logged 'unhandled ClientDisconnect' with a traceback per connection."""
    caplog.set_level(logging.DEBUG, logger="api.errors")
    _, writer = await asyncio.open_connection("127.0.0.1", api.settings.api_port)
    key = client.headers["Authorization"]
    writer.write(
        b"POST /v1/notifications HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: {key}\r\nContent-Length: 1000\r\n\r\n".encode()
        + b'{"event_id": "gone'
    )
    await writer.drain()
    writer.close()
    await wait_until(lambda: any("client left" in r.getMessage() for r in caplog.records))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
