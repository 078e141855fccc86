"""What a newcomer meets first outside `clarion dev`: `clarion keys create --tenant acme` gives the
tenant the shipped templates, so the README's first send works with the printed key; a
`CLARION_DEV_API_KEY` of the wrong shape ends `clarion dev` with one line, not a traceback."""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
from pathlib import Path

import httpx
import pytest

from clarion.settings import Settings
from harness.services import ApiServer
from tests.fixtures.sends import email_send

ROOT = Path(__file__).resolve().parents[2]


async def _clarion(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "commands.cli", *args, cwd=ROOT, env={**clean, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_keys_create_gives_a_new_tenant_the_shipped_templates(
    settings: Settings, api: ApiServer
) -> None:
    tenant = f"acme-{secrets.token_hex(3)}"
    env = {"CLARION_DATABASE_URL": settings.database_url, "CLARION_SECRET_KEY": secrets.token_hex(32)}
    code, out, err = await _clarion("keys", "create", "--tenant", tenant, "--scopes", "send,read", env=env)
    assert code == 0, err
    key = out.strip()
    assert key.startswith("clk_") and "\n" not in key  # stdout is the key alone: KEY=$(...)
    assert "shipped templates" in err
    # Again for the same tenant: a second key, nothing installed twice.
    code, _, again = await _clarion("keys", "create", "--tenant", tenant, env=env)
    assert code == 0 and "shipped templates" not in again

    async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {key}"}) as client:
        first = await client.post("/v1/notifications", json=email_send())  # the README's first send
        assert first.status_code == 202, first.text


async def test_keys_create_without_templates_when_asked(settings: Settings, api: ApiServer) -> None:
    env = {"CLARION_DATABASE_URL": settings.database_url, "CLARION_SECRET_KEY": secrets.token_hex(32)}
    tenant = f"bare-{secrets.token_hex(3)}"
    code, out, err = await _clarion("keys", "create", "--tenant", tenant, "--no-templates", env=env)
    assert code == 0, err
    async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {out.strip()}"}) as c:
        refused = await c.post("/v1/notifications", json=email_send())
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "unknown_template"


@pytest.mark.parametrize(
    "key", ["s3cret", "clk_only", "clk__secret", "pk_live_abc", "clk_dev_with space", "clk_a_" + "x" * 300]
)
async def test_a_dev_key_of_the_wrong_shape_ends_clarion_dev_with_one_line(key: str) -> None:
    code, out, err = await _clarion(
        "dev", "--port", "1", env={"CLARION_DEV_API_KEY": key, "CLARION_DATABASE_URL": "postgresql://nowhere"}
    )
    assert code == 2
    assert "Traceback" not in err and out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "CLARION_DEV_API_KEY" in lines[0] and "clk_<id>_<secret>" in lines[0]
