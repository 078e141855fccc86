"""The operations dashboard in headless Chromium: admin sign-in, a notification sent during the
test shows up, the charts keep updating, failures show their codes, redrive answers, and nothing is
loaded from outside the API."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from playwright.async_api import expect

from harness.services import ApiServer
from tests.conftest import Stack, TenantInfo, make_tenant
from tests.fixtures.browser import browser_page, needs_chromium
from tests.fixtures.delivery import wait_status
from tests.fixtures.sends import email_send, held_back

pytestmark = needs_chromium


async def test_operator_signs_in_sees_a_fresh_send_and_live_charts(
    stack: Stack, api: ApiServer, client: httpx.AsyncClient, tenant: TenantInfo, engine: object
) -> None:
    nid = (await client.post("/v1/notifications", json=email_send())).json()["id"]
    await wait_status(client, nid, "sent")
    reader = await make_tenant(engine, scopes=("send", "read"))  # type: ignore[arg-type]

    async with browser_page() as (page, errors):
        hosts: set[str] = set()
        page.on("request", lambda request: hosts.add(urlsplit(request.url).netloc))
        await page.goto(f"{api.url}/ops?interval_ms=500")

        # A key without the admin scope is refused and the page stays on the sign-in form.
        await page.fill("#api-key", reader.key)
        await page.click("#sign-in")
        await expect(page.locator("#login-error")).to_contain_text("forbidden")
        await expect(page.locator("#dashboard")).to_be_hidden()

        await page.fill("#api-key", tenant.key)
        await page.click("#sign-in")
        await expect(page.locator("#dashboard")).to_be_visible()
        row = page.locator(f'#recent tr[data-id="{nid}"]')
        await expect(row).to_contain_text("sent")
        await expect(row).to_contain_text("email")
        await expect(page.locator('#statuses-email tr[data-status="sent"]')).to_contain_text("1")

        chart = page.locator("#chart-email")
        await expect(chart).not_to_have_attribute("data-samples", "0")
        first = int(await chart.get_attribute("data-samples") or 0)
        await expect(chart).not_to_have_attribute("data-samples", str(first), timeout=5000)
        last = json.loads(await chart.get_attribute("data-last") or "null")
        assert last["throughput"] == 1  # one notification completed in the last minute

        # The redrive button answers (nothing is dead, so nothing is requeued).
        await page.click("#redrive-email")
        await expect(page.locator("#redrive-status-email")).not_to_have_text("Redriving…")
        await expect(page.locator("#redrive-status-email")).not_to_contain_text("failed")

        assert errors == []
        assert hosts == {urlsplit(api.url).netloc}  # no CDN, no third-party request


async def test_recent_failures_show_their_error_codes(
    api: ApiServer, client: httpx.AsyncClient, tenant: TenantInfo, engine: object
) -> None:
    import sqlalchemy as sa

    nid = (await client.post("/v1/notifications", json=email_send(send_at=held_back()))).json()["id"]
    async with engine.begin() as conn:  # type: ignore[attr-defined]
        await conn.execute(
            sa.text(
                "UPDATE notifications SET status = 'failed', error_code = 'invalid_recipient',"
                " error_message = 'Does not contain a valid address.' WHERE id = :id"
            ),
            {"id": nid},
        )
    async with browser_page() as (page, _):
        await page.goto(f"{api.url}/ops")
        await page.fill("#api-key", tenant.key)
        await page.click("#sign-in")
        failure = page.locator(f'#failures tr[data-id="{nid}"]')
        await expect(failure).to_contain_text("invalid_recipient")
        await expect(failure).to_contain_text("failed")


async def test_the_dashboard_charts_engagement_rates_per_template_without_outside_assets(
    stack: Stack, api: ApiServer, engine: object, tmp_path: Path
) -> None:
    admin = await make_tenant(engine)  # type: ignore[arg-type]
    async with httpx.AsyncClient(
        base_url=api.url, headers={"Authorization": f"Bearer {admin.key}"}
    ) as client:
        ids = [(await client.post("/v1/notifications", json=email_send())).json()["id"] for _ in range(2)]
        for nid in ids:
            await wait_status(client, nid, "sent")
        await client.post(f"/v1/notifications/{ids[0]}/events", json={"type": "opened"})
    async with browser_page() as (page, errors):
        await page.set_viewport_size({"width": 1280, "height": 1400})
        hosts: set[str] = set()
        page.on("request", lambda request: hosts.add(urlsplit(request.url).netloc))
        await page.goto(f"{api.url}/ops?analytics_ms=1000")
        await page.fill("#api-key", admin.key)
        await page.click("#sign-in")
        chart = page.locator("#analytics-email-order_shipped canvas")
        await expect(chart).to_have_attribute("data-rates", re.compile('"sent":2'), timeout=15_000)
        rates = json.loads(await chart.get_attribute("data-rates") or "{}")
        assert rates["open_rate"] == 0.5 and rates["click_rate"] == 0.0
        await expect(page.locator("#analytics-email-order_shipped")).to_contain_text("opened 50.0%")
        shot = tmp_path / "engagement.png"
        await page.locator("#analytics").screenshot(path=str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 2_000
        assert errors == []
        assert hosts == {urlsplit(api.url).netloc}  # no CDN, no third-party request


# What a tenant may put in the values the dashboard shows: its event ids (any text) and, through a
# provider's answer, an error message.
MARKUP_EVENT = '<img src=x onerror="window.__ran = (window.__ran || 0) + 1">'
MARKUP_MESSAGE = "<script>window.__ran = 1</script><b>bold</b>"


async def test_tenant_markup_is_shown_as_text_and_no_injected_script_can_run(
    api: ApiServer, client: httpx.AsyncClient, tenant: TenantInfo, engine: object
) -> None:
    import sqlalchemy as sa

    recent = await client.post(
        "/v1/notifications", json=email_send(event_id=MARKUP_EVENT, send_at=held_back())
    )
    failed = (await client.post("/v1/notifications", json=email_send(send_at=held_back()))).json()["id"]
    async with engine.begin() as conn:  # type: ignore[attr-defined]
        await conn.execute(
            sa.text(
                "UPDATE notifications SET status = 'failed', error_code = 'x', error_message = :m WHERE id = :id"
            ),
            {"id": failed, "m": MARKUP_MESSAGE},
        )
    async with browser_page() as (page, errors):
        blocked: list[str] = []
        page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
        await page.goto(f"{api.url}/ops?interval_ms=500")
        await page.fill("#api-key", tenant.key)
        await page.click("#sign-in")
        await expect(page.locator(f'#recent tr[data-id="{recent.json()["id"]}"]')).to_contain_text(
            MARKUP_EVENT
        )
        await expect(page.locator(f'#failures tr[data-id="{failed}"]')).to_contain_text(MARKUP_MESSAGE)
        assert await page.locator("#recent img, #failures script, #failures b").count() == 0
        assert blocked == [] and errors == []  # the page's own scripts and requests all run

        # Were a value ever to reach the DOM as HTML, the page's policy still runs none of it: the
        # image's own onerror (an inline handler) would have run before this listener.
        ran = await page.evaluate(
            """(markup) => new Promise((done) => {
                 const box = document.createElement("div");
                 box.innerHTML = markup;
                 box.querySelector("img").addEventListener("error", () => done(window.__ran ?? null));
                 document.body.append(box);
               })""",
            MARKUP_EVENT,
        )
        assert ran is None
