"""deploy/prometheus: the rules pass promtool (syntax and their unit tests), every series they and
the Grafana dashboard name is one Clarion exports, and a real Prometheus server scraping a running
Clarion (the shipped scrape config, the metrics token) fires the outage alerts when SendGrid fails.

promtool and prometheus come from Debian's `prometheus` package (`make prometheus`)."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import REGISTRY

from clarion.ports import free_port
from clarion.retry_settings import BreakerSettings
from clarion.settings import Settings
from core.ratelimit_fail_open import fail_open_counter
from harness.fakes.sendgrid import FakeSendGrid
from harness.services import wait_until
from providers.registry import ProviderSet
from providers.sendgrid import SendGridProvider
from schema.enums import Channel
from tests.conftest import METRICS_TOKEN
from tests.fixtures.delivery import wait_status
from tests.fixtures.own_lane import OwnLane, fast_retries, own_lane, tenant_client
from tests.fixtures.provider_settings import sendgrid_settings
from tests.fixtures.sends import email_send

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
PROMTOOL = "/usr/bin/promtool"
PROMETHEUS = "/usr/bin/prometheus"
OUTAGE_ALERTS = ("ClarionBreakerOpen", "ClarionProviderErrorRate")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if not Path(PROMTOOL).exists():
        pytest.fail("promtool is missing: run `make prometheus` (Debian's prometheus package)")
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def test_alert_rules_pass_promtool_check() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 22 rules found" in result.stdout


def test_alert_rules_unit_tests_pass() -> None:
    result = promtool("test", "rules", str(RULES.with_name("alerts_test.yml")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-kubernetes.yml"])
def test_scrape_configs_are_valid(tmp_path: Path, name: str) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    shutil.copy(RULES, tmp_path / "alerts.yml")
    config = yaml.safe_load((DEPLOY / "prometheus" / name).read_text())
    api = next(job for job in config["scrape_configs"] if job["job_name"] == "clarion-api")
    assert api["authorization"]["type"] == "Bearer", "the API's /metrics wants CLARION_METRICS_TOKEN"
    api["authorization"]["credentials_file"] = str(token)
    (tmp_path / name).write_text(yaml.safe_dump(config))
    result = promtool("check", "config", str(tmp_path / name))
    assert result.returncode == 0, result.stdout + result.stderr
    assert {job["job_name"] for job in config["scrape_configs"]} == {
        "clarion-api",
        "clarion-workers",
        "clarion-relay",
        "clarion-webhooks",
    }


def exported_names() -> set[str]:
    """Every series name Clarion's processes can export (histograms with their suffixes)."""
    fail_open_counter()  # registered by the Redis limiter when it starts
    names: set[str] = set()
    for family in REGISTRY.collect():
        base = family.name
        if family.type == "histogram":
            names |= {f"{base}_bucket", f"{base}_count", f"{base}_sum"}
        elif family.type == "counter":
            names.add(f"{base}_total")
        else:
            names.add(base)
    assert {"clarion_breaker_state", "clarion_provider_call_seconds_count"} <= names
    return names


def test_rules_and_dashboard_name_only_series_clarion_exports() -> None:
    exported = exported_names()
    rules = yaml.safe_load(RULES.read_text())
    exprs = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    dashboard = json.loads((DEPLOY / "grafana" / "clarion.json").read_text())
    exprs += [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    named = {name for expr in exprs for name in re.findall(r"\bclarion_[a-z_]+", expr)}
    assert named - exported == set(), "series no Clarion process exports"
    # Every alert the issue asks for is there.
    assert {
        "clarion_dlq_size",
        "clarion_consumer_lag",
        "clarion_oldest_waiting_age_seconds",
        "clarion_breaker_state",
        "clarion_ratelimit_fail_open_total",
        "clarion_provider_call_seconds_count",
        "clarion_relay_republished_total",
        "clarion_notifications_rejected_total",
        "clarion_worker_render_deferrals_total",
    } <= named


def dashboard_queries() -> list[str]:
    """The Grafana dashboard's panel queries as PromQL (its variables set to "All")."""
    dashboard = json.loads((DEPLOY / "grafana" / "clarion.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]
    return [
        e.replace("$__rate_interval", "5m").replace("$channel", ".*").replace("$provider", ".*")
        for e in exprs
    ]


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "clarion.json").read_text())
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}", panel["title"]
    records = [{"record": f"dashboard:panel_{i}", "expr": e} for i, e in enumerate(dashboard_queries())]
    rules = tmp_path / "dashboard.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    result = promtool("check", "rules", str(rules))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(records)} rules found" in result.stdout


# -- a real Prometheus server against a running Clarion ------------------------------------------


EmailLane = OwnLane[FakeSendGrid]


@pytest.fixture(scope="module")
async def email_lane(settings: Settings) -> AsyncIterator[EmailLane]:
    """API, relay and an email worker whose only route is SendGrid (its fake), no failover, on a
    broker and database of their own (an outage must not reach the shared stack's workers)."""
    retry = fast_retries(
        max_wait_s=0.2,
        max_attempts=100,
        retry_base_s=0.5,
        retry_max_s=1.0,
        hold_max_s=2.0,
        breaker=BreakerSettings(failure_rate=0.5, window_s=30, min_calls=4, cool_down_s=1.0),
    )
    async with own_lane(
        settings, database="clarion_prom", fake=FakeSendGrid(), providers=via_sendgrid, retry=retry
    ) as lane:
        yield lane


def via_sendgrid(fake: FakeSendGrid) -> ProviderSet:
    return ProviderSet(routes={(Channel.email, None): SendGridProvider(sendgrid_settings(fake, timeout_s=2))})


def scrape_config_for_test(tmp_path: Path, api_url: str) -> Path:
    """The shipped scrape config's API job (bearer token from a file) pointed at ``api_url``, every
    second, with the shipped rules whose ``for`` is 0s: the expressions are the ones shipped.

    Workers and relay run in the API's process here and share its registry, so its /metrics
    already shows their series: scraping them again would count every counter twice."""
    shipped = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    [api_job] = [job for job in shipped["scrape_configs"] if job["job_name"] == "clarion-api"]
    (tmp_path / "token").write_text(METRICS_TOKEN)
    api_job["authorization"]["credentials_file"] = str(tmp_path / "token")
    del api_job["dns_sd_configs"]
    api_job["static_configs"] = [{"targets": [httpx.URL(api_url).netloc.decode()]}]
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "alerts.yml")],
        "scrape_configs": [api_job],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def prometheus_server(config: Path, data: Path) -> Iterator[str]:
    if not Path(PROMETHEUS).exists():
        pytest.fail("prometheus is missing: run `make prometheus` (Debian's prometheus package)")
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(data.parent / "prometheus.log").open("wb"),
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def query(prom: httpx.AsyncClient, promql: str) -> list[dict[str, Any]]:
    response = await prom.get("/api/v1/query", params={"query": promql})
    assert response.status_code == 200, response.text
    return list(response.json()["data"]["result"])


async def firing(prom: httpx.AsyncClient, provider: str) -> set[str]:
    response = await prom.get("/api/v1/alerts")
    assert response.status_code == 200, response.text
    return {
        a["labels"]["alertname"]
        for a in response.json()["data"]["alerts"]
        if a["state"] == "firing" and a["labels"].get("provider") == provider
    }


async def test_a_real_prometheus_scrapes_clarion_and_fires_the_outage_alerts_when_sendgrid_fails(
    email_lane: EmailLane, tmp_path: Path
) -> None:
    config = scrape_config_for_test(tmp_path, email_lane.api.url)
    async with (
        tenant_client(email_lane) as client,
        httpx.AsyncClient(timeout=5) as prom,
    ):
        # SendGrid healthy: one email goes through, which sets this worker's breaker (closed).
        response = await client.post("/v1/notifications", json=email_send())
        assert response.status_code == 202, response.text
        await wait_status(client, response.json()["id"], "sent")

        with prometheus_server(config, tmp_path / "data") as url:
            prom.base_url = httpx.URL(url)

            async def ready() -> bool:
                with contextlib.suppress(httpx.TransportError):
                    return (await prom.get("/-/ready")).status_code == 200
                return False

            await wait_until(ready, 20, 0.2)

            # The scrape authenticates with the token and sees the breaker closed: no alert yet.
            async def scraped_closed() -> bool:
                up = await query(prom, 'up{job="clarion-api"} == 1')
                closed = await query(prom, 'clarion_breaker_state{provider="sendgrid"} == 0')
                return bool(up and closed)

            await wait_until(scraped_closed, 20, 0.2)
            assert await firing(prom, "sendgrid") == set()

            # The outage: every SendGrid call answers 500.
            email_lane.fake.force_server_error(100_000, status=500)
            for i in range(6):
                body = email_send(user={"id": f"u-{i}", "email": f"down{i}@example.com"})
                assert (await client.post("/v1/notifications", json=body)).status_code == 202

            async def alerts_fire() -> bool:
                return set(OUTAGE_ALERTS) <= await firing(prom, "sendgrid")

            await wait_until(alerts_fire, 40, 0.25)

            # The series an operator graphs are there, labelled as the rules expect.
            assert await query(prom, 'clarion_breaker_state{provider="sendgrid"} >= 1')
            failed = 'clarion_provider_call_seconds_count{provider="sendgrid",outcome="transient"} > 0'
            assert await query(prom, failed)
            waiting = await query(prom, 'clarion_oldest_waiting_age_seconds{channel="email",lane="main"}')
            assert waiting, "the per-lane waiting age is scraped"
            assert await query(prom, 'clarion_consumer_lag{group="clarion-email"}')
            # Every dashboard query runs on this Prometheus; its breaker panel shows the outage.
            answered = {e: await query(prom, e) for e in dashboard_queries()}
            [breakers] = [e for e in answered if "clarion_breaker_state" in e]
            shown = {r["metric"]["provider"]: float(r["value"][1]) for r in answered[breakers]}
            assert shown.get("sendgrid", 0) >= 1
        email_lane.fake.reset()
