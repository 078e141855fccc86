"""Fuzz every operation of the OpenAPI document (schemathesis) against a running ``clarion api``.

The API runs as its own OS process; schemathesis generates valid and invalid requests for every
operation, sent with a real admin key. Expected: no response is a 5xx, and every 4xx carries the
error shape ``{"error": {"code": str, "message": str, "details": ...}}``. Examples per operation
are bounded so the whole run stays under a minute.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode
from sqlalchemy.ext.asyncio import AsyncEngine

from clarion.broker import free_port
from clarion.settings import Settings
from tests.conftest import make_tenant
from tests.fixtures.services import ClarionProcess, wait_until

EXAMPLES_PER_MODE = 12
BUDGET_S = 50.0


@pytest.fixture
async def running_api(settings: Settings, engine: AsyncEngine) -> AsyncIterator[tuple[str, str]]:
    """``clarion api`` as a separate process on a free port, and an admin key for a fresh tenant."""
    own = settings.model_copy(update={"api_port": free_port()})
    proc = ClarionProcess(own, "api")
    proc.start()
    url = f"http://127.0.0.1:{own.api_port}"
    tenant = await make_tenant(engine)
    try:
        import httpx

        async def up() -> bool:
            try:
                async with httpx.AsyncClient() as c:
                    return (await c.get(f"{url}/healthz")).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_until(up, 60, 0.2)
        yield url, tenant.key
    finally:
        await asyncio.to_thread(proc.stop, 15)


def _problem(response: Any) -> str | None:
    """Why this response breaks the contract, or None. Pages meant for a browser (the preference
    page, the unsubscribe confirmation) answer their errors in HTML, as a person reads them."""
    if response.status_code >= 500:
        return f"server error {response.status_code}: {response.text[:300]}"
    content_type = response.headers.get("content-type") or [""]
    if isinstance(content_type, list):
        content_type = content_type[0] if content_type else ""
    if response.status_code < 400 or content_type.startswith("text/html"):
        return None
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code} without the error shape: {response.text[:300]}"
    if not (isinstance(error.get("code"), str) and error["code"] and isinstance(error.get("message"), str)):
        return f"{response.status_code} with a malformed error: {error!r}"
    if "details" not in error:
        return f"{response.status_code} error without 'details': {error!r}"
    return None


def _fuzz(
    operation: Any,
    mode: GenerationMode,
    *,
    url: str,
    headers: dict[str, str],
    stop_at: float,
    problems: dict[str, str],
) -> int:
    """Up to EXAMPLES_PER_MODE generated requests for ``operation`` (until ``stop_at``); returns how
    many were sent and adds each contract violation to ``problems``."""
    sent = 0

    @given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis_settings(
        max_examples=EXAMPLES_PER_MODE,
        deadline=None,
        database=None,
        derandomize=os.environ.get("CLARION_FUZZ_RANDOM") is None,
        suppress_health_check=list(HealthCheck),
    )
    def fuzz(case: Any) -> None:
        nonlocal sent
        if time.monotonic() > stop_at:
            return
        response = case.call(base_url=url, headers=headers, timeout=10)
        sent += 1
        problem = _problem(response)
        if problem is not None:
            sent_body = repr(case.body)[:300]
            problems.setdefault(
                f"{operation.label} [{mode.value}] {case.method} {case.formatted_path} {sent_body}", problem
            )

    try:
        fuzz()
    except Unsatisfiable:  # nothing invalid can be made for it (no parameters, no body)
        pass
    return sent


def test_fuzzed_requests_get_no_5xx_and_every_4xx_has_the_error_shape(
    running_api: tuple[str, str],
) -> None:
    url, key = running_api
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    headers = {"Authorization": f"Bearer {key}"}
    problems: dict[str, str] = {}
    calls = 0
    started = time.monotonic()
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    assert len(operations) >= 25
    per_operation_s = BUDGET_S / len(operations)
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            stop_at = time.monotonic() + per_operation_s / 2
            calls += _fuzz(operation, mode, url=url, headers=headers, stop_at=stop_at, problems=problems)
    elapsed_s = time.monotonic() - started
    print(f"fuzzed {len(operations)} operations with {calls} requests in {elapsed_s:.1f}s")
    assert calls >= len(operations), "the fuzzer sent almost nothing"
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())
