"""A known sequence of sends, observed the way an operator would: consumer lag while the email
workers are stopped and after they catch up, the Prometheus counters, and the JSON logs.

The scenario runs once against a broker and database of its own (stopping workers must not disturb
the shared stack), with SendGrid served by its local fake:

1. no email worker runs: 3 good emails, 1 to an address SendGrid refuses, 1 to a user whose address
   is removed before delivery, and 2 promotions to one user capped at 1 per hour (drop) are
   accepted and published, and wait in Kafka;
2. a worker starts and catches up: 4 sent, 1 failed, 1 suppressed, 1 throttled.

(Stopping a worker that already ran and starting another costs ~25 s more on Tansu, which waits
out the old member's session before rebalancing; a group that never committed shows the same lag.)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from clarion.broker import TansuBroker
from clarion.kafka import create_topics
from clarion.logs import JsonFormatter
from clarion.settings import Settings
from harness.fakes.sendgrid import FakeSendGrid
from harness.services import ApiServer, api_client, drop_database, fresh_database, wait_until
from providers.settings import ProvidersSettings
from schema.enums import Channel
from tests.conftest import METRICS_TOKEN, OPERATOR_TOKEN, make_tenant
from tests.fixtures.answers import scrape
from tests.fixtures.delivery import status_of
from tests.fixtures.provider_settings import sendgrid_settings
from tests.fixtures.sends import email_send
from workers.app import Worker

SECRET_DATA = "ZX-PRIVATE-991"
PHONE_DIGITS = "4155550100"
FINAL = {"sent", "failed", "suppressed", "throttled"}
CAP_RULE = "one-promo-per-hour"
CAP_METRIC_LABEL = "tenant:recipient"  # a tenant rule is labelled by its scope, never its name


@dataclass
class Observed:
    tenant_id: str
    ids: dict[str, str] = field(default_factory=dict)  # role -> notification id
    events: dict[str, str] = field(default_factory=dict)  # role -> event id
    metrics_before: str = ""
    metrics_stopped: str = ""
    metrics_after: str = ""
    queues_stopped: dict[str, Any] = field(default_factory=dict)
    queues_after: dict[str, Any] = field(default_factory=dict)
    statuses: dict[str, str] = field(default_factory=dict)
    log_lines: list[dict[str, Any]] = field(default_factory=list)
    catch_up_s: float = 0.0


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def _email_main(report: dict[str, Any]) -> dict[str, Any]:
    email = next(c for c in report["channels"] if c["channel"] == "email")
    return dict(next(lane for lane in email["lanes"] if lane["lane"] == "main"))


@pytest.fixture(scope="module")
async def observed(settings: Settings) -> AsyncIterator[Observed]:
    broker = TansuBroker()
    broker.start()
    url = await fresh_database("clarion_lag")
    fake = FakeSendGrid()
    await fake.start()
    fake.fail_email("refused@example.com", status=403, message="Sender identity not verified.", field=None)
    own = settings.model_copy(
        update={
            "database_url": url,
            "kafka_bootstrap": broker.bootstrap,
            "providers": ProvidersSettings(
                sendgrid=sendgrid_settings(fake, from_email="noreply@example.com")
            ),
        }
    )
    await create_topics(broker.bootstrap, partitions=2)
    engine = create_async_engine(url)
    tenant = await make_tenant(engine)
    api = ApiServer(own)
    await api.start()
    capture = _Lines()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(capture)
    root.setLevel(logging.INFO)
    seen = Observed(tenant.id)
    worker: Worker | None = None
    try:
        async with api_client(api.url, tenant.key) as client:

            async def metrics() -> str:
                scraper = {"Authorization": f"Bearer {METRICS_TOKEN}"}
                return (await client.get("/metrics", headers=scraper)).text

            async def queues() -> dict[str, Any]:
                operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}  # Kafka lag is the operator's
                response = await client.get("/v1/ops/cluster/queues", headers=operator)
                assert response.status_code == 200, response.text
                return dict(response.json())

            async def send(role: str, address: str, **overrides: Any) -> None:
                body = email_send(
                    user={"id": f"u-{address.split('@')[0]}", "email": address, "phone": f"+1{PHONE_DIGITS}"},
                    data={"order_id": SECRET_DATA},
                    **overrides,
                )
                response = await client.post("/v1/notifications", json=body)
                assert response.status_code == 202, response.text
                seen.ids[role], seen.events[role] = response.json()["id"], body["event_id"]

            async def reached(roles: list[str], statuses: set[str]) -> bool:
                for role in roles:
                    seen.statuses[role] = (await status_of(client, seen.ids[role]))["status"]
                return all(seen.statuses[r] in statuses for r in roles)

            seen.metrics_before = await metrics()
            cap = {
                "name": CAP_RULE,
                "scope": "recipient",
                "channel": "email",
                "category": "promo",
                "limit": 1,
                "period_s": 3600,
                "action": "drop",
            }
            assert (await client.post("/v1/rate-limits", json=cap)).status_code == 201
            await send("ok-1", "ok-1@example.com")
            await send("ok-2", "ok-2@example.com")
            await send("ok-3", "ok-3@example.com")
            await send("refused", "refused@example.com")
            await send("gone", "gone@example.com")
            await send("promo-1", "promo@example.com", category="promo")
            await send("promo-2", "promo@example.com", category="promo")
            async with engine.begin() as conn:  # the address is erased before the worker gets to it
                await conn.execute(sa.text("UPDATE users SET email = NULL WHERE external_id = 'u-gone'"))
            waiting = ["ok-1", "ok-2", "ok-3", "refused", "gone", "promo-1", "promo-2"]
            await wait_until(lambda: reached(waiting, {"queued"}), 15)

            async def aged() -> dict[str, Any] | None:  # no worker runs: the records wait in Kafka
                report = await queues()
                return report if (_email_main(report)["oldest_age_s"] or 0) > 1.0 else None

            seen.queues_stopped = await wait_until(aged, 15, 0.2)
            seen.metrics_stopped = await metrics()

            started = time.monotonic()
            worker = Worker(own, Channel.email)
            await worker.start()
            await wait_until(lambda: reached(waiting, FINAL), 40)

            async def caught_up() -> dict[str, Any] | None:
                report = await queues()
                return report if _email_main(report)["lag"] == 0 else None

            seen.queues_after = await wait_until(caught_up, 20, 0.2)
            seen.catch_up_s = time.monotonic() - started
            seen.metrics_after = await metrics()
    finally:
        root.removeHandler(capture)
        root.setLevel(old_level)
        if worker is not None:
            await worker.stop()
        await api.stop()
        await fake.stop()
        await engine.dispose()
        broker.stop()
        await drop_database(url)
    seen.log_lines = [json.loads(line) for line in capture.lines]
    yield seen


def _delta(seen: Observed, name: str, **labels: str) -> float:
    return scrape(seen.metrics_after, name, **labels) - scrape(seen.metrics_before, name, **labels)


def test_the_sequence_ends_with_four_sent_one_failed_one_suppressed_one_throttled(observed: Observed) -> None:
    statuses = dict(observed.statuses)
    promos = sorted([statuses.pop("promo-1"), statuses.pop("promo-2")])
    assert promos == ["sent", "throttled"]
    assert statuses == {
        "ok-1": "sent",
        "ok-2": "sent",
        "ok-3": "sent",
        "refused": "failed",
        "gone": "suppressed",
    }
    email = next(c for c in observed.queues_after["channels"] if c["channel"] == "email")
    assert email["counts"] == {"sent": 4, "failed": 1, "suppressed": 1, "throttled": 1}


def test_lag_counts_the_records_waiting_while_workers_are_stopped(observed: Observed) -> None:
    main = _email_main(observed.queues_stopped)
    assert main["lag"] == 7
    assert sum(p["lag"] for p in main["partitions"]) == 7
    assert all(p["committed_offset"] is None for p in main["partitions"])  # the group never consumed
    assert main["depth"] == 7 and main["oldest_age_s"] > 1.0
    text = observed.metrics_stopped
    assert scrape(text, "clarion_consumer_lag", topic="notifications.email", group="clarion-email") == 7
    assert scrape(text, "clarion_queue_depth", channel="email", lane="main") == 7
    assert scrape(text, "clarion_oldest_undelivered_age_seconds", channel="email") > 1.0


def test_lag_returns_to_zero_once_workers_catch_up(observed: Observed) -> None:
    main = _email_main(observed.queues_after)
    assert main["lag"] == 0 and main["depth"] == 0 and main["oldest_age_s"] is None
    assert all(p["committed_offset"] == p["end_offset"] for p in main["partitions"])
    assert sum(p["end_offset"] for p in main["partitions"]) == 7
    text = observed.metrics_after
    assert scrape(text, "clarion_consumer_lag", topic="notifications.email", group="clarion-email") == 0
    assert scrape(text, "clarion_queue_depth", channel="email", lane="main") == 0
    assert scrape(text, "clarion_oldest_undelivered_age_seconds", channel="email") == 0


def test_outcome_metrics_match_the_known_sequence(observed: Observed) -> None:
    outcome = "clarion_notifications_outcome_total"
    assert _delta(observed, outcome, channel="email", provider="sendgrid", status="sent") == 4
    assert _delta(observed, outcome, channel="email", provider="sendgrid", status="failed") == 1
    assert _delta(observed, outcome, channel="email", provider="none", status="suppressed") == 1
    assert _delta(observed, outcome, channel="email", provider="none", status="throttled") == 1
    assert _delta(observed, "clarion_provider_errors_total", provider="sendgrid") == 1
    calls = _delta(observed, "clarion_provider_call_seconds_count", provider="sendgrid")
    assert calls == 5  # 4 sent + 1 refused; the suppressed and throttled ones never reach SendGrid
    decisions = "clarion_ratelimit_decisions_total"
    assert _delta(observed, decisions, rule=CAP_METRIC_LABEL, decision="allowed") == 1
    assert _delta(observed, decisions, rule=CAP_METRIC_LABEL, decision="dropped") == 1
    accepted = "clarion_notifications_accepted_total"
    assert _delta(observed, accepted, tenant=observed.tenant_id, channel="email") == 7


def test_notification_logs_carry_ids_and_no_personal_data(observed: Observed) -> None:
    lines = observed.log_lines
    about = {line["notification_id"]: line for line in lines if "notification_id" in line}
    for role in ("refused", "gone"):  # what an operator looks for at INFO: why one was not sent
        line = about[observed.ids[role]]
        assert line["event_id"] == observed.events[role]
        assert line["level"] == "info" and line["channel"] == "email"
    assert "failed" in about[observed.ids["refused"]]["msg"]
    assert "suppressed (no_contact)" in about[observed.ids["gone"]]["msg"]
    assert any(
        "throttled" in about[observed.ids[r]]["msg"]
        for r in ("promo-1", "promo-2")
        if observed.ids[r] in about
    )
    text = "\n".join(json.dumps(line) for line in lines)
    assert "@example.com" not in text
    assert PHONE_DIGITS not in text
    assert SECRET_DATA not in text and "shipped" not in text.lower()
