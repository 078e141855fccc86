"""The pooled HTTP session of an aiohttp-based adapter, and what its transport failures mean.

The session is opened on first use, inside the running event loop (an adapter is built before the
loop that sends runs), closed by ``aclose``, and opened anew if the adapter sends again after that.
A timeout or a failed connection is a `TransientProviderError` (``timeout``, ``connection_error``),
turned so in one place, `transport_errors`, as httpx maps httpcore's errors.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import aiohttp

from providers.errors import TransientProviderError


class LazySession:
    """One adapter's connection pool: at most ``max_connections``, every request bounded by
    ``timeout_s`` as a whole, ``headers`` sent with each."""

    def __init__(
        self, *, timeout_s: float, max_connections: int, headers: Mapping[str, str] | None = None
    ) -> None:
        self._timeout_s = timeout_s
        self._max_connections = max_connections
        self._headers = dict(headers) if headers is not None else None
        self._session: aiohttp.ClientSession | None = None

    def get(self) -> aiohttp.ClientSession:
        """The open session, opened now if there is none."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                headers=self._headers,
            )
        return self._session

    async def aclose(self) -> None:
        """Close the pool; a later ``get`` opens a new one."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


@contextlib.contextmanager
def transport_errors(*, provider: str, label: str) -> Iterator[None]:
    """Raise a timeout or a failed connection inside the block as the `TransientProviderError` it
    is; ``label`` names the service in the message ("Twilio timed out")."""
    try:
        yield
    except TimeoutError as exc:
        raise TransientProviderError(f"{label} timed out", provider=provider, code="timeout") from exc
    except aiohttp.ClientError as exc:
        raise TransientProviderError(
            f"{label} connection failed: {exc!r}", provider=provider, code="connection_error"
        ) from exc


def json_object(raw: bytes) -> dict[str, Any]:
    """A response body as the JSON object it should be: ``{}`` when it is empty, not JSON, or not
    an object (a proxy's HTML error page, a truncated body)."""
    try:
        document = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return document if isinstance(document, dict) else {}
