"""Stateful fuzzing: schemathesis chains operations through the links it infers from the OpenAPI
document (a created template is previewed and activated, a created rule is read, changed and
deleted, a user's devices are added and removed...), so generated requests reach real resources
instead of 404s. Expected, as for the one-operation fuzzer: no 5xx, every 4xx has the error shape.
Bounded by example and step counts (about half a minute here)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import schemathesis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from clarion.settings import Settings
from schema.db import create_engine
from tests.conftest import make_tenant
from tests.fixtures.contract import contract_problem

SEQUENCES = 25
STEPS_PER_SEQUENCE = 8


def test_chained_operations_get_no_5xx_and_every_4xx_has_the_error_shape(
    running_api: tuple[str, str], settings: Settings
) -> None:
    url, _ = running_api
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    problems: dict[str, str] = {}
    calls: list[str] = []
    base = schema.as_state_machine()

    class Workflow(base):  # type: ignore[valid-type,misc]
        def setup(self) -> None:
            # A tenant of its own per sequence: the same steps then meet the same answers (a user
            # PUT twice is 201 then 200), which hypothesis needs to replay what it generated.
            self.key = asyncio.run(_fresh_key(settings.database_url))

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"base_url": url, "headers": {"Authorization": f"Bearer {self.key}"}, "timeout": 30}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            calls.append(f"{case.method} {case.path}")
            problem = contract_problem(response)
            if problem is not None:
                problems.setdefault(f"{case.method} {case.formatted_path} {repr(case.body)[:300]}", problem)

    Workflow.run(
        settings=hypothesis_settings(
            max_examples=SEQUENCES,
            stateful_step_count=STEPS_PER_SEQUENCE,
            deadline=None,
            database=None,
            derandomize=os.environ.get("CLARION_FUZZ_RANDOM") is None,
            suppress_health_check=list(HealthCheck),
        )
    )
    linked = {c for c in calls if "{" in c}  # operations reached with an id another call returned
    print(f"{len(calls)} chained calls over {len({*calls})} operations ({len(linked)} with a path id)")
    assert len(calls) >= SEQUENCES, "the state machine made almost no calls"
    assert linked, "no chained call reached a resource by its id: the links are gone"
    assert not problems, "\n".join(f"{k}: {v}" for k, v in problems.items())


async def _fresh_key(database_url: str) -> str:
    engine = create_engine(database_url, pool_size=1)
    try:
        return (await make_tenant(engine)).key
    finally:
        await engine.dispose()
