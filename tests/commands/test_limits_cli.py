"""``clarion limits`` as a real OS process: the operator's rules apply to every tenant, each tenant
counted on its own, and no tenant can see or delete them.

On a database and API of the test's own: a global rule reaches every process sharing the database,
and the session's other tests would meet it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from uuid import uuid4

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from api.rate_limits import RateLimitOut
from clarion.settings import Settings
from commands.limits_cli import _line
from harness.services import (
    ROOT,
    ApiServer,
    api_client,
    drop_database,
    fresh_database,
    settings_env,
    wait_until,
)
from harness.tenants import make_tenant
from schema.db import create_engine
from tests.fixtures.answers import assert_error
from tests.fixtures.sends import email_send


async def clarion(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "commands.cli", "limits", *args],
        env=settings_env(settings),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
async def own(settings: Settings) -> AsyncIterator[tuple[Settings, ApiServer, AsyncEngine]]:
    url = await fresh_database("clarion_limits")
    mine = settings.model_copy(update={"database_url": url})
    api = ApiServer(mine)
    await api.start()
    engine = create_engine(url)
    try:
        yield mine, api, engine
    finally:
        await api.stop()
        await engine.dispose()
        await drop_database(url)


async def _rule_names(api: ApiServer) -> set[str]:
    snapshot = await api.app.state.ingress.rules.current()
    return {spec.name for spec in snapshot.for_tenant("tenant", "any-tenant")}


async def test_a_global_tenant_rule_gives_each_tenant_its_own_budget(
    own: tuple[Settings, ApiServer, AsyncEngine],
) -> None:
    settings, api, engine = own
    made = await clarion(
        settings, "set", "per-tenant", "--scope", "tenant", "--limit", "2", "--period-s", "600"
    )
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("created per-tenant")
    await wait_until(lambda: _rule_names(api), interval_s=0.05)  # the API's rules cache has it

    a, b = await make_tenant(engine), await make_tenant(engine)
    async with api_client(api.url, a.key) as ca, api_client(api.url, b.key) as cb:
        for client in (ca, cb):  # each tenant has 2, whatever the other spent
            for _ in range(2):
                assert (await client.post("/v1/notifications", json=email_send())).status_code == 202
            refused = assert_error(
                await client.post("/v1/notifications", json=email_send()), 429, "rate_limited"
            )
            assert refused["details"]["rule"] == "per-tenant"

        assert (await ca.get("/v1/rate-limits")).json() == []  # not the tenant's to see
        [stored] = [
            json.loads(line) for line in (await clarion(settings, "list", "--json")).stdout.splitlines()
        ]
        assert (stored["name"], stored["scope"], stored["limit"]) == ("per-tenant", "tenant", 2)
        assert (await ca.delete(f"/v1/rate-limits/{stored['id']}")).status_code == 404

        replaced = await clarion(
            settings, "set", "per-tenant", "--scope", "tenant", "--limit", "3", "--period-s", "600"
        )
        assert replaced.stdout.startswith("replaced per-tenant"), replaced.stderr
        assert len((await clarion(settings, "list", "--json")).stdout.splitlines()) == 1

        assert (await clarion(settings, "delete", "per-tenant")).returncode == 0
        await wait_until(lambda: _empty(api), interval_s=0.05)
        assert (await ca.post("/v1/notifications", json=email_send())).status_code == 202


async def _empty(api: ApiServer) -> bool:
    return not await _rule_names(api)


BAD = [
    ["set", "r", "--scope", "tenant", "--limit", "0", "--period-s", "1"],
    ["set", "r", "--scope", "tenant", "--limit", "5", "--period-s", "1", "--channel", "sms"],
    ["set", "r", "--scope", "tenant", "--limit", "5", "--period-s", "1", "--action", "delay"],
    ["set", "", "--scope", "tenant", "--limit", "5", "--period-s", "1"],
    ["set", "r", "--scope", "provider", "--limit", "5", "--period-s", "1", "--provider", "nope"],
    ["delete", "no-such-rule"],
]


async def test_a_bad_rule_ends_with_one_line_and_stores_nothing(
    own: tuple[Settings, ApiServer, AsyncEngine],
) -> None:
    settings, _, _ = own
    for args in BAD:  # one process each, in turn (a process start is most of the test's time)
        done = await clarion(settings, *args)
        assert done.returncode == 1, (args, done.stdout)
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert (await clarion(settings, "list")).stdout == ""


def test_a_rule_name_stored_before_names_were_checked_is_listed_inert() -> None:
    """Before: ``clarion limits list`` printed an operator rule's stored name raw, so its escapes
    (an OSC 52 clipboard write, a bidi override) reached the operator's terminal."""
    now = datetime.now(UTC)
    hostile = "a\x1b]52;c;ZWNobyBoaQ==\x07\u202eb"
    rule = RateLimitOut(
        id=uuid4(), name=hostile, scope="tenant", channel=None, category=None, provider=None, limit=5,
        period_s=1, burst=5, mode="hard", overshoot_pct=0, action="delay", enabled=True,
        created_at=now, updated_at=now,
    )  # fmt: skip

    line = _line(rule)

    assert line.isprintable() and line.startswith("a\\x1b]52;c;ZWNobyBoaQ==\\x07\\u202eb  tenant")
