"""Operators: GET /v1/ops/queues, GET /metrics, the refused-send counter and the /ops page."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families

from clarion import status
from clarion.pg import asyncpg_dsn
from clarion.ports import free_port
from clarion.settings import Settings
from harness.services import ROOT, ApiServer, api_client, wait_until
from schema.partitions import ensure_ahead
from tests.conftest import METRICS_TOKEN, OPERATOR_TOKEN, Stack, TenantInfo, make_tenant
from tests.fixtures.answers import scrape
from tests.fixtures.delivery import wait_status
from tests.fixtures.sends import email_send

LANES = ["main", "bulk", "retry", "dlq"]


async def metrics_text(api: ApiServer) -> str:
    async with api_client(api.url, METRICS_TOKEN) as scraper:
        response = await scraper.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return response.text


async def queues(client: httpx.AsyncClient) -> dict[str, Any]:
    response = await client.get("/v1/ops/queues")
    assert response.status_code == 200, response.text
    return dict(response.json())


def channel_of(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in report["channels"] if c["channel"] == name)


async def test_queues_need_an_admin_key(api: ApiServer, engine: Any) -> None:
    reader = await make_tenant(engine, scopes=("send", "read"))
    async with api_client(api.url, reader.key) as client:
        response = await client.get("/v1/ops/queues")
    assert response.status_code == 403 and response.json()["error"]["code"] == "forbidden"
    async with api_client(api.url, None) as anonymous:
        assert (await anonymous.get("/v1/ops/queues")).status_code == 401


async def test_queues_show_every_channel_and_lane_with_partitions_and_a_sent_notification(
    stack: Stack, client: httpx.AsyncClient
) -> None:
    nid = (await client.post("/v1/notifications", json=email_send())).json()["id"]
    await wait_status(client, nid, "sent")
    report = await queues(client)
    # A tenant sees its own figures from the log; Kafka's offsets are every tenant's traffic.
    assert report["kafka"]["available"] is False and "operator" in report["kafka"]["error"]
    assert [c["channel"] for c in report["channels"]] == ["push", "sms", "email"]
    email = channel_of(report, "email")
    assert [lane["lane"] for lane in email["lanes"]] == LANES
    main = email["lanes"][0]
    assert (main["topic"], main["group"]) == ("notifications.email", "clarion-email")
    assert main["lag"] is None and main["partitions"] == []
    operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    cluster = (await client.get("/v1/ops/cluster/queues", headers=operator)).json()
    assert cluster["kafka"] == {"available": True, "error": None}
    cluster_main = channel_of(cluster, "email")["lanes"][0]
    assert [p["partition"] for p in cluster_main["partitions"]] == [0, 1]  # the test topics have 2
    assert all(p["end_offset"] >= p["lag"] >= 0 for p in cluster_main["partitions"])
    assert email["counts"] == {"sent": 1}
    assert email["completed_last_min"] == 1 and email["accepted_last_min"] == 1
    assert email["depth"] == 0 and email["oldest_age_s"] is None
    assert channel_of(report, "sms")["counts"] == {}


async def test_queues_show_the_logs_reach_and_only_the_operator_its_size(client: httpx.AsyncClient) -> None:
    today = datetime.now(UTC).date()
    log = (await queues(client))["log"]
    # The session's database is young: a day or two (another test adds yesterday's partitions).
    assert log["retention_days"] == 30 and log["oldest_day"] in {
        today.isoformat(),
        (today - timedelta(days=1)).isoformat(),
    }
    assert log["days_kept"] in {1, 2} and log["partitions_ahead"] >= 2 and log["default_rows"] == 0
    assert log["total_bytes"] is None  # every tenant's data: the operator's figure
    operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    cluster = (await client.get("/v1/ops/cluster/queues", headers=operator)).json()
    assert cluster["log"]["total_bytes"] > 0


async def test_a_scheduled_notification_waits_in_the_queue_without_counting_as_late(
    client: httpx.AsyncClient,
) -> None:
    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    await client.post("/v1/notifications", json=email_send(send_at=later, priority="bulk"))
    email = channel_of(await queues(client), "email")
    bulk = next(lane for lane in email["lanes"] if lane["lane"] == "bulk")
    assert (bulk["depth"], bulk["oldest_age_s"]) == (1, None)
    assert email["counts"] == {"scheduled": 1}


async def test_a_due_waiting_notification_reports_its_age(client: httpx.AsyncClient, engine: Any) -> None:
    import sqlalchemy as sa

    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()  # no worker touches it meanwhile
    nid = (await client.post("/v1/notifications", json=email_send(send_at=later))).json()["id"]
    async with engine.begin() as conn:  # now a notification queued 5 minutes ago that nobody took
        await conn.execute(
            sa.text(
                "UPDATE notifications SET status = 'queued', send_at = NULL, not_before = NULL,"
                " created_at = now() - interval '5 minutes' WHERE id = :id"
            ),
            {"id": nid},
        )
    email = channel_of(await queues(client), "email")
    assert email["depth"] == 1
    assert 300 <= email["oldest_age_s"] < 360


async def test_dead_notifications_show_as_the_dead_letter_queue(
    api: ApiServer, client: httpx.AsyncClient, engine: Any, database_url: str
) -> None:
    import sqlalchemy as sa

    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()  # no worker touches it meanwhile
    otp = email_send(channel="sms", template="otp", data={"code": "1"}, send_at=later)
    nid = (await client.post("/v1/notifications", json=otp)).json()["id"]
    # The log has no default partition: the day it moves to must be there (the days either side of
    # it too, whichever side of midnight the database's now() falls).
    raw = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        four_days_ago = (datetime.now(UTC) - timedelta(days=4)).date()
        await ensure_ahead(raw, parent="notifications", today=four_days_ago, days_ahead=2)
    finally:
        await raw.close()
    async with engine.begin() as conn:  # as if its retries were exhausted days ago
        await conn.execute(
            sa.text(
                "UPDATE notifications SET status = 'dead', created_at = now() - interval '3 days' WHERE id = :id"
            ),
            {"id": nid},
        )
    sms = channel_of(await queues(client), "sms")
    assert sms["dlq"] == 1
    assert next(lane for lane in sms["lanes"] if lane["lane"] == "dlq")["depth"] == 1

    async def dlq_gauge() -> float:  # gauges refresh at most once a second, whoever scraped last
        return scrape(await metrics_text(api), "clarion_dlq_size", channel="sms")

    assert await wait_until(dlq_gauge, 5, 0.2) >= 1


async def test_metrics_show_queue_gauges_for_every_topic_partition(api: ApiServer) -> None:
    text = await metrics_text(api)
    for channel in ("push", "sms", "email"):
        for partition in ("0", "1"):
            lag = [
                s
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "clarion_consumer_lag"
                and s.labels
                == {
                    "topic": f"notifications.{channel}",
                    "partition": partition,
                    "group": f"clarion-{channel}",
                }
            ]
            assert len(lag) == 1, (channel, partition)
        assert f'clarion_oldest_undelivered_age_seconds{{channel="{channel}"}}' in text
        assert f'clarion_queue_depth{{channel="{channel}",lane="main"}}' in text
        assert f'clarion_dlq_size{{channel="{channel}"}}' in text


async def test_refused_sends_are_counted_by_tenant_channel_and_reason(
    api: ApiServer, client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    before = await metrics_text(api)
    assert (await client.post("/v1/notifications", json=email_send(channel="fax"))).status_code == 422
    no_phone = email_send(channel="sms", template="otp", user={"id": "u-nophone", "email": "n@example.com"})
    for _ in range(2):
        assert (await client.post("/v1/notifications", json=no_phone)).status_code == 422
    async with api_client(api.url, "clk_nope_wrong") as stranger:
        assert (await stranger.post("/v1/notifications", json=email_send())).status_code == 401
    assert (await client.post("/v1/notifications", json=email_send())).status_code == 202
    after = await metrics_text(api)

    def delta(**labels: str) -> float:
        name = "clarion_notifications_rejected_total"
        return scrape(after, name, **labels) - scrape(before, name, **labels)

    assert delta(tenant=tenant.id, channel="unknown", reason="validation_error") == 1
    assert delta(tenant=tenant.id, channel="sms", reason="no_contact") == 2
    assert delta(tenant=tenant.id) == 3
    # An unauthenticated send is refused before its body is read: its channel is never known.
    assert delta(tenant="unauthenticated", channel="unknown", reason="unauthorized") == 1
    accepted = "clarion_notifications_accepted_total"
    assert scrape(after, accepted, tenant=tenant.id, channel="email") == 1


async def test_dashboard_page_and_script_are_served_locally(api: ApiServer) -> None:
    async with api_client(api.url, None) as anonymous:
        page = await anonymous.get("/ops")
        script = await anonymous.get("/ops/ops.js")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert '<script src="/ops/ops.js">' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # no CDN
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert "/v1/ops/queues" in script.text and "https://" not in script.text


def clarion_status(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CLARION_")}
    return subprocess.run(
        [sys.executable, "-m", "commands.cli", "status", *args],
        env={**environment, **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_clarion_status_prints_the_same_numbers_as_a_table(
    api: ApiServer, client: httpx.AsyncClient, tenant: TenantInfo
) -> None:
    later = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    for _ in range(2):
        await client.post("/v1/notifications", json=email_send(send_at=later))
    result = await asyncio.to_thread(clarion_status, "--url", api.url, env={"CLARION_API_KEY": tenant.key})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "this tenant's notifications only" in lines[0]
    assert (
        lines[1].startswith("Log: ")
        and "day(s) kept since 20" in lines[1]
        and "retention 30 days" in lines[1]
    )
    email_main = next(line.split() for line in lines if line.split()[:2] == ["email", "main"])
    assert email_main[2] == "2"  # waiting
    header = next(line.split() for line in lines if line.startswith("CHANNEL") and "SCHEDULED" in line)
    email_counts = next(
        line.split() for line in lines[lines.index("  ".join(header)) :] if line.startswith("email")
    )
    assert email_counts[header.index("SCHEDULED")] == "2"


async def test_clarion_status_explains_a_refused_key_and_an_unreachable_api(api: ApiServer) -> None:
    refused = await asyncio.to_thread(clarion_status, "--url", api.url, "--api-key", "clk_nope_wrong")
    assert refused.returncode == 2
    assert "refused the key" in refused.stderr and "unauthorized" in refused.stderr
    # The other failures in-process (each subprocess costs seconds of imports).
    out, err = io.StringIO(), io.StringIO()
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert await asyncio.to_thread(status.main, url=nowhere, api_key="k", out=out, err=err) == 1
    assert "cannot reach the Clarion API" in err.getvalue() and out.getvalue() == ""
    err = io.StringIO()
    assert await asyncio.to_thread(status.main, url=api.url, api_key=None, err=err) == 2
    assert "CLARION_API_KEY" in err.getvalue()


async def test_cluster_figures_need_the_operator_token_and_no_tenant_key_opens_them(
    api: ApiServer, client: httpx.AsyncClient
) -> None:
    assert (await client.get("/v1/ops/cluster/queues")).status_code == 401  # an admin tenant key
    async with api_client(api.url, None) as anonymous:
        wrong = await anonymous.get("/v1/ops/cluster/queues", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        right = await anonymous.get(
            "/v1/ops/cluster/queues", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
        )
        assert right.status_code == 200 and right.json()["kafka"]["available"] is True


async def test_without_an_operator_token_the_cluster_route_does_not_exist(settings: Settings) -> None:
    server = ApiServer(settings.model_copy(update={"operator_token": None}))
    await server.start()
    try:
        async with api_client(server.url, None) as anonymous:
            response = await anonymous.get("/v1/ops/cluster/queues", headers={"Authorization": "Bearer x"})
        assert response.status_code == 404
    finally:
        await server.stop()
