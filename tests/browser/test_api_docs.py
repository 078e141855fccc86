"""The interactive API docs in headless Chromium with every host but the API's blocked (a machine
without internet): /docs renders from packaged assets, shows the send operation, takes an API key
through "Authorize", and "Try it out" sends a notification that the API then has."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import httpx
from playwright.async_api import Route, expect

from harness.services import ApiServer
from tests.conftest import TenantInfo
from tests.fixtures.browser import browser_page, needs_chromium
from tests.fixtures.sends import email_send

pytestmark = needs_chromium


async def test_docs_render_offline_and_try_it_out_sends(
    api: ApiServer, client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    own_host = urlsplit(api.url).netloc
    blocked: list[str] = []
    served: list[str] = []

    async def only_the_api(route: Route) -> None:
        if urlsplit(route.request.url).netloc == own_host:
            served.append(urlsplit(route.request.url).path)
            await route.continue_()
        else:
            blocked.append(route.request.url)
            await route.abort("internetdisconnected")

    body = email_send()
    async with browser_page() as (page, errors):
        await page.route("**/*", only_the_api)
        await page.goto(f"{api.url}/docs")

        send = page.locator('.opblock-post:has(.opblock-summary-path[data-path="/v1/notifications"])')
        await expect(send).to_be_visible(timeout=15_000)

        await page.click("button.authorize")
        await page.locator(".auth-container input").first.fill(tenant.key)
        await page.locator(".auth-container button.authorize").first.click()
        await page.locator("button.btn-done").first.click()

        await send.locator(".opblock-summary").click()
        await send.locator("button.try-out__btn").click()
        await send.locator("textarea.body-param__text").fill(json.dumps(body))
        await send.locator("button.execute").click()
        status = send.locator(".live-responses-table tbody td.response-col_status").first
        await expect(status).to_contain_text("202", timeout=15_000)
        answer = json.loads(await send.locator(".live-responses-table tbody .microlight").first.inner_text())

    assert answer["status"] in {"accepted", "queued"} and answer["duplicate"] is False
    stored = await client.get(f"/v1/notifications/{answer['id']}")
    assert stored.status_code == 200 and stored.json()["event_id"] == body["event_id"]
    assert blocked == [], f"the docs asked for outside hosts: {blocked}"
    assert any(path.startswith("/docs/assets/") for path in served) and "/openapi.json" in served
    assert errors == []
