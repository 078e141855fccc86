"""Bearer API-key authentication and scope checks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from fastapi import Request

from api.errors import ApiError
from clarion.tenants import Principal, lookup_key

# Lookups are cached briefly so a hot key costs no query per request; a revoked key is
# refused once its entry expires (within CACHE_TTL_S).
CACHE_TTL_S = 5.0


class KeyCache:
    def __init__(self, ttl_s: float = CACHE_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._entries: dict[str, tuple[float, Principal | None]] = {}
        self._loading: dict[str, asyncio.Future[Principal | None]] = {}

    def get(self, key: str) -> tuple[bool, Principal | None]:
        entry = self._entries.get(key)
        if entry is None or entry[0] < time.monotonic():
            return False, None
        return True, entry[1]

    def put(self, key: str, principal: Principal | None) -> None:
        if len(self._entries) > 10_000:
            self._entries.clear()
        self._entries[key] = (time.monotonic() + self.ttl_s, principal)

    async def resolve(self, key: str, load: Callable[[], Awaitable[Principal | None]]) -> Principal | None:
        """The cached principal, or ``load()``'s, shared by every request that misses meanwhile: when
        an entry expires under load, one lookup serves them all (not one connection each)."""
        hit, principal = self.get(key)
        if hit:
            return principal
        task = self._loading.get(key)
        if task is None:
            task = self._loading[key] = asyncio.ensure_future(load())
            task.add_done_callback(lambda done: self._loaded(key, done))
        return await asyncio.shield(task)  # one caller going away does not cancel the others' lookup

    def _loaded(self, key: str, task: asyncio.Future[Principal | None]) -> None:
        self._loading.pop(key, None)
        if not task.cancelled() and task.exception() is None:
            self.put(key, task.result())


async def authenticate(request: Request) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise ApiError(
            401,
            "unauthorized",
            "Send your API key as 'Authorization: Bearer <key>'.",
            headers={"WWW-Authenticate": "Bearer"},
        )
    key = key.strip()
    cache: KeyCache = request.app.state.key_cache
    engine = request.app.state.engine

    async def load() -> Principal | None:
        async with engine.connect() as conn:
            return await lookup_key(conn, key)

    principal = await cache.resolve(key, load)
    if principal is None:
        raise ApiError(
            401, "unauthorized", "The API key is unknown or revoked.", headers={"WWW-Authenticate": "Bearer"}
        )
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
