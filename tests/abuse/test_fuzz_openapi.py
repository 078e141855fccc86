"""Fuzz every operation of the OpenAPI document (schemathesis) against a running ``clarion api``.

The API runs as its own OS process; schemathesis generates valid and invalid requests for every
operation, sent with a real admin key. Expected: no response is a 5xx, and every 4xx carries the
error shape ``{"error": {"code": str, "message": str, "details": ...}}``. Examples per operation
are bounded so the whole run stays under a minute.
"""

from __future__ import annotations

import os
import time
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode

from tests.fixtures.contract import contract_problem

EXAMPLES_PER_MODE = 12
BUDGET_S = 50.0


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
        problem = contract_problem(response)
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
