"""What the sync and async clients share: requests as data, retry decisions, batching."""

from __future__ import annotations

import email.utils
import itertools
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter

from clarion_client.errors import ClarionError, error_from
from clarion_client.models import Notification

T = TypeVar("T")
RETRY_STATUSES = frozenset({429, 503})
BATCH_SIZE = 1_000  # the API's limit per POST /v1/notifications/batch
Progress = Callable[[int, int | None], None]
DEFAULT_URL = "http://127.0.0.1:8000"


@dataclass(frozen=True)
class Call:
    """One API call: method, path, JSON body (serialised once: a retry sends the same bytes, the
    same event_id), and what the answer parses into."""

    method: str
    path: str
    body: bytes | None = None
    params: dict[str, Any] | None = None
    parse: Any = None  # a type for TypeAdapter, or None for no body


def body(value: BaseModel | dict[str, Any] | list[Any], model: type[BaseModel] | None = None) -> bytes:
    if isinstance(value, BaseModel):
        return value.model_dump_json(exclude_none=True).encode()
    if model is not None and isinstance(value, dict):  # validated here, before any request
        return model.model_validate(value).model_dump_json(exclude_none=True).encode()
    return TypeAdapter(Any).dump_json(value)


def segment(value: str) -> str:
    return quote(value, safe="")


def parse(call: Call, response: httpx.Response) -> Any:
    if call.parse is None:
        return None
    return TypeAdapter(call.parse).validate_json(response.content)


def next_page(call: Call, response: httpx.Response) -> Call | None:
    """The next page of a listing, when the answer names one (``Link: <...>; rel="next"``).

    Only on the API's own origin, and never the page just read: a link elsewhere would get the
    API key, one to the same page would be read for ever (``ClarionError`` ``invalid_link``)."""
    link = response.links.get("next")
    if not link:
        return None
    here = response.request.url
    there = here.join(link["url"])
    if (there.scheme, there.host, there.port) != (here.scheme, here.host, here.port):
        raise _invalid_link(response, "names another origin")
    if there == here:
        raise _invalid_link(response, "names the page it was on")
    return Call("GET", str(there), parse=call.parse)


def _invalid_link(response: httpx.Response, why: str) -> ClarionError:
    return ClarionError(response.status_code, "invalid_link", f"The answer's next-page link {why}.")


def retry_after_s(response: httpx.Response, attempt: int, *, base_s: float, max_s: float) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): the server's ``Retry-After`` (seconds or
    an HTTP date) when it sends one, else exponential backoff; never more than ``max_s``."""
    wait = _server_wait_s(response.headers.get("retry-after"))
    if wait is None:
        wait = base_s * 2 ** (attempt - 1)
    return min(max(wait, 0.0), max_s)


def _server_wait_s(header: str | None) -> float | None:
    """``Retry-After`` in seconds, or None when absent or neither a number nor an HTTP date (what
    a proxy may send: never NaN, which ``time.sleep`` refuses and ``asyncio.sleep`` never ends)."""
    if not header:
        return None
    try:
        wait = float(header)
    except ValueError:
        try:
            wait = email.utils.parsedate_to_datetime(header).timestamp() - time.time()
        except (ValueError, TypeError, IndexError, OverflowError):
            return None
    return wait if math.isfinite(wait) or wait > 0 else None


def should_retry(response: httpx.Response, attempt: int, max_retries: int) -> bool:
    return response.status_code in RETRY_STATUSES and attempt <= max_retries


def raise_for(response: httpx.Response, retry_after: float | None = None) -> None:
    if response.status_code >= 400:
        if retry_after is None:
            retry_after = _server_wait_s(response.headers.get("retry-after"))
        raise error_from(response, retry_after)


def chunks(items: Iterable[Notification | dict[str, Any]], size: int) -> Iterator[list[Any]]:
    if not 1 <= size <= BATCH_SIZE:
        raise ValueError(f"a batch holds 1 to {BATCH_SIZE} notifications")
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield [
            (n if isinstance(n, Notification) else Notification.model_validate(n)).model_dump(
                mode="json", exclude_none=True
            )
            for n in chunk
        ]


def total_of(items: Iterable[Any]) -> int | None:
    try:
        return len(items)  # type: ignore[arg-type]
    except TypeError:
        return None


def progress_callback(progress: Progress | bool | None) -> Progress | None:
    """``True`` draws a bar on stderr; a callable gets ``(sent so far, total or None)``."""
    if progress is True:
        return bar
    if progress is False or progress is None:
        return None
    return progress


def bar(done: int, total: int | None) -> None:
    if total:
        filled = int(30 * done / total)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total}")
    else:
        sys.stderr.write(f"\r{done} sent")
    if total is not None and done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def headers(api_key: str) -> dict[str, str]:
    """The headers of every call."""
    return {
        "Authorization": f"Bearer {api_key}",
        "Content-Type": "application/json",
        "User-Agent": "clarion-client-python/0.1.0",
    }
