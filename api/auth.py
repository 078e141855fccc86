"""Bearer API-key authentication and scope checks."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable

from fastapi import Request
from pydantic import SecretStr

from api.errors import ApiError
from clarion.tenants import Principal, lookup_key, split_key

# Lookups are cached briefly so a hot key costs no query per request; a revoked key is
# refused once its entry expires (within CACHE_TTL_S).
CACHE_TTL_S = 5.0


class KeyCache:
    """Recent key lookups, by the SHA-256 of the key (never the key itself: a 2 MB bearer string
    costs 32 bytes here), at most ``max_entries``: the oldest go first, expired ones on the way."""

    def __init__(self, ttl_s: float = CACHE_TTL_S, max_entries: int = 10_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[bytes, tuple[float, Principal | None]] = {}  # insertion order = age
        self._loading: dict[bytes, asyncio.Future[Principal | None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> tuple[bool, Principal | None]:
        entry = self._entries.get(_digest(key))
        if entry is None or entry[0] < time.monotonic():
            return False, None
        return True, entry[1]

    def put(self, key: str, principal: Principal | None) -> None:
        self._store(_digest(key), principal)

    def _store(self, digest: bytes, principal: Principal | None) -> None:
        now = time.monotonic()
        self._entries.pop(digest, None)
        while self._entries:
            oldest, (expires, _) = next(iter(self._entries.items()))
            if expires >= now and len(self._entries) < self.max_entries:
                break
            del self._entries[oldest]
        self._entries[digest] = (now + self.ttl_s, principal)

    async def resolve(self, key: str, load: Callable[[], Awaitable[Principal | None]]) -> Principal | None:
        """The cached principal, or ``load()``'s, shared by every request that misses meanwhile: when
        an entry expires under load, one lookup serves them all (not one connection each)."""
        digest = _digest(key)
        hit, principal = self.get(key)
        if hit:
            return principal
        task = self._loading.get(digest)
        if task is None:
            task = self._loading[digest] = asyncio.ensure_future(load())
            task.add_done_callback(lambda done: self._loaded(digest, done))
        return await asyncio.shield(task)  # one caller going away does not cancel the others' lookup

    def _loaded(self, digest: bytes, task: asyncio.Future[Principal | None]) -> None:
        self._loading.pop(digest, None)
        if not task.cancelled() and task.exception() is None:
            self._store(digest, task.result())


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


async def authenticate(request: Request) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise unauthorized("Send your API key as 'Authorization: Bearer <key>'.")
    key = key.strip()
    if split_key(key) is None:  # not clk_<id>_<secret> (at most 200 characters): never looked up
        raise unauthorized("The API key is unknown or revoked.")
    cache: KeyCache = request.app.state.key_cache
    engine = request.app.state.engine

    async def load() -> Principal | None:
        async with engine.connect() as conn:
            return await lookup_key(conn, key)

    principal = await cache.resolve(key, load)
    if principal is None:
        raise unauthorized("The API key is unknown or revoked.")
    request.state.principal = principal
    return principal


async def authorize(request: Request, scope: str) -> Principal:
    """Authenticate and demand ``scope`` (``admin`` implies every scope)."""
    principal = await authenticate(request)
    if scope not in principal.scopes and "admin" not in principal.scopes:
        raise ApiError(403, "forbidden", f"This API key lacks the '{scope}' scope.")
    return principal


def require(scope: str) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency that authenticates and demands ``scope`` (``admin`` implies every scope)."""

    async def dependency(request: Request) -> Principal:
        return await authorize(request, scope)

    return dependency


def unauthorized(message: str) -> ApiError:
    """A 401 asking for bearer credentials (``WWW-Authenticate: Bearer``); ``message`` says which."""
    return ApiError(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})


def bearer_matches(request: Request, token: SecretStr) -> bool:
    """Whether the request's bearer value is ``token`` (compared in constant time)."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.get_secret_value().encode()
    )


async def require_operator(request: Request) -> None:
    """The platform operator (``CLARION_OPERATOR_TOKEN``), never a tenant key: 401 without
    credentials, 404 for any bearer value while no token is configured (the route does not
    exist), 401 for any other bearer value."""
    token = request.app.state.settings.operator_token
    ask = "Send the operator token as 'Authorization: Bearer <CLARION_OPERATOR_TOKEN>'."
    if not request.headers.get("authorization"):  # no credentials at all: 401 first, as everywhere
        raise unauthorized(ask)
    if token is None:
        raise ApiError(404, "not_found", "Set CLARION_OPERATOR_TOKEN to serve the operator routes.")
    if not bearer_matches(request, token):
        raise unauthorized(ask)
