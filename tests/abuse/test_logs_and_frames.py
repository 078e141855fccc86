"""What the API writes to its log and how its pages may be framed."""

from __future__ import annotations

import logging

import httpx
import pytest
from fastapi import FastAPI

from api.errors import install_error_handlers
from harness.services import ApiServer, api_client


async def test_the_ops_page_refuses_to_be_framed(api: ApiServer) -> None:
    async with api_client(api.url, None) as anonymous:
        page = await anonymous.get("/ops")
    assert page.status_code == 200
    assert page.headers["x-frame-options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


async def test_the_ops_page_runs_only_its_own_scripts(api: ApiServer) -> None:
    """The page shows tenants' values; its policy allows no inline script or handler, no other
    origin for scripts or requests, no <base>, and no form submission (an admin key in a URL)."""
    async with api_client(api.url, None) as anonymous:
        page = await anonymous.get("/ops")
        script = await anonymous.get("/ops/ops.js")
    directives = {
        name: value
        for name, _, value in (
            d.strip().partition(" ") for d in page.headers["content-security-policy"].split(";")
        )
    }
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'" and directives["connect-src"] == "'self'"
    assert directives["form-action"] == "'none'" and directives["base-uri"] == "'none'"
    assert script.headers["x-content-type-options"] == "nosniff"


async def test_an_unhandled_error_is_logged_by_class_and_route_without_its_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = "s3cr3t-value-from-the-request"
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/boom")
    async def boom() -> None:
        raise ValueError(f"could not handle {secret}")

    caplog.set_level(logging.INFO)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        response = await c.post("/boom", json={"value": secret})
    assert response.status_code == 500 and response.json()["error"]["code"] == "internal_error"
    assert "ValueError" in caplog.text and "/boom" in caplog.text
    assert secret not in caplog.text
