"""One webhook call: the SSRF check on the addresses it connects to, the signature, the POST.

Guarantees of ``call``: it never raises for anything the receiver or the network does (the answer
is a ``CallResult``); it connects only to an address ``core.ssrf`` checked a moment before (the URL
is rewritten to that address, the name goes in ``Host`` and TLS SNI, so a second DNS answer is
never used); it follows no redirect, reads no proxy from the environment, reads at most
``MAX_ANSWER_BYTES`` of the answer and takes at most ``timeout_s`` in all.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx

from core import ssrf
from core.dns import Resolver
from core.webhook_signing import headers as signed_headers
from workers.webhook_claim import ClaimedDelivery

MAX_ANSWER_BYTES = 1024
MAX_RETRY_AFTER_S = 3600.0
USER_AGENT = "Clarion-Webhooks/1"


@dataclass(frozen=True, slots=True, kw_only=True)
class CallResult:
    ok: bool
    status: int | None = None  # the HTTP status, when an answer came
    error: str | None = None  # why it failed, as the tenant reads it in last_error
    retry_after_s: float | None = None  # a 429/503's Retry-After, in seconds
    refused: bool = False  # the SSRF rule refused the URL: no call was made


def new_client() -> httpx.AsyncClient:
    """The client every call of a process shares (its pool keyed by the checked address)."""
    return httpx.AsyncClient(
        follow_redirects=False,
        trust_env=False,
        limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
    )


async def call(
    *,
    client: httpx.AsyncClient,
    delivery: ClaimedDelivery,
    allow: ssrf.AllowList,
    timeout_s: float,
    resolver: Resolver | None = None,
) -> CallResult:
    """POST the delivery's body, signed, to its endpoint (see the module docstring). The host is
    looked up on ``resolver``, counted against the delivery's tenant (``core/dns.py``)."""
    try:
        resolved = await ssrf.resolve(delivery.url, allow=allow, resolver=resolver, key=delivery.tenant_id)
    except ssrf.UrlRefused as exc:
        return CallResult(ok=False, error=f"{exc.code}: {exc.message}", refused=True)
    url = resolved.url
    headers = signed_headers(
        secrets=delivery.secrets, msg_id=delivery.msg_id, timestamp_s=int(time.time()), body=delivery.body
    )
    headers.update({"content-type": "application/json", "host": url.authority, "user-agent": USER_AGENT})
    extensions = {"sni_hostname": url.host} if url.scheme == "https" else {}
    try:
        async with asyncio.timeout(timeout_s):
            response = await _post(client, resolved, delivery.body, headers, extensions, timeout_s)
    except (TimeoutError, httpx.TimeoutException):
        return CallResult(ok=False, error=f"timeout: no answer within {timeout_s:g}s")
    except httpx.HTTPError as exc:
        return CallResult(ok=False, error=f"connection failed: {type(exc).__name__}")
    status = response.status_code
    if 200 <= status < 300:
        return CallResult(ok=True, status=status)
    kind = "redirect not followed" if 300 <= status < 400 else "answered"
    return CallResult(
        ok=False, status=status, error=f"{kind} HTTP {status}", retry_after_s=_retry_after(response)
    )


async def _post(
    client: httpx.AsyncClient,
    resolved: ssrf.Resolved,
    body: str,
    headers: dict[str, str],
    extensions: dict[str, str],
    timeout_s: float,
) -> httpx.Response:
    """POST to the checked addresses in turn until one takes the connection (a name with an IPv6
    and an IPv4 address, one of them unreachable); the answer's body is read in part and closed."""
    for index, address in enumerate(resolved.addresses):
        request = client.build_request(
            "POST",
            resolved.url.with_address(address),
            content=body.encode(),
            headers=headers,
            extensions=extensions,
            timeout=timeout_s,
        )
        try:
            response = await client.send(request, stream=True)
        except httpx.ConnectError:
            if index == len(resolved.addresses) - 1:
                raise
            continue
        try:
            await _read_some(response)
        finally:
            await response.aclose()
        return response
    raise httpx.ConnectError("no address to connect to")  # resolve() never returns none


async def _read_some(response: httpx.Response) -> None:
    """Read up to ``MAX_ANSWER_BYTES`` (so the connection can be reused); the rest is dropped."""
    read = 0
    async for chunk in response.aiter_raw():
        read += len(chunk)
        if read >= MAX_ANSWER_BYTES:
            break


def _retry_after(response: httpx.Response) -> float | None:
    if response.status_code not in (429, 503):
        return None
    try:
        value = float(response.headers.get("retry-after", ""))
    except ValueError:
        return None
    return min(value, MAX_RETRY_AFTER_S) if value >= 0 else None
