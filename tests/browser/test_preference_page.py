"""The preference page in a real browser (headless Chromium): toggle, save, reload shows the change."""

from __future__ import annotations

import httpx
from playwright.async_api import expect

from harness.services import ApiServer
from tests.fixtures.browser import browser_page, needs_chromium

pytestmark = needs_chromium


async def test_person_switches_a_category_off_saves_and_sees_it_after_reload(
    api: ApiServer, client: httpx.AsyncClient
) -> None:
    await client.put("/v1/users/u-web", json={"email": "web@example.com"})
    await client.put("/v1/categories/news", json={})
    await client.put("/v1/categories/security", json={"required": True})
    link = (await client.post("/v1/users/u-web/preferences/link")).json()

    async with browser_page() as (page, errors):
        await page.goto(link["url"])
        news_email = page.locator("#pref-news-email")
        await expect(news_email).to_be_checked()
        await expect(page.locator("#pref-security-email")).to_be_disabled()

        await news_email.uncheck()
        await page.get_by_role("button", name="Save").click()
        await expect(page.locator("#status")).to_have_text("Saved")

        await page.reload()
        await expect(page.locator("#pref-news-email")).not_to_be_checked()
        await expect(page.locator("#pref-news-sms")).to_be_checked()
        assert errors == []

    view = (await client.get("/v1/users/u-web/preferences")).json()
    assert view["preferences"] == [{"channel": "email", "category": "news", "opted_in": False}]


async def test_page_with_a_forged_token_says_the_link_is_not_valid(api: ApiServer) -> None:
    async with browser_page() as (page, _):
        response = await page.goto(f"{api.url}/preferences?token=forged.token")
        assert response is not None and response.status == 403
        await expect(page.get_by_role("heading")).to_have_text("Link not valid")
