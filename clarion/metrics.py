"""Every Prometheus metric Clarion exports, defined once (``prometheus-client``, default registry).

Each process (API, each worker, relay) exposes its own ``/metrics``; label sets stay small
(tenant, channel, provider, status, reason, rule) so cardinality is bounded by configuration.
Under ``clarion api --workers N`` the API processes share their series through prometheus_client's
multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set by ``commands.api_workers``): counters and
histograms add up over the processes, and a gauge reads as the value some process set last
(``multiprocess_mode="mostrecent"``; outside that mode the argument changes nothing).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ACCEPTED = Counter(
    "clarion_notifications_accepted_total", "Notifications accepted by the API.", ["tenant", "channel"]
)
REJECTED = Counter(
    "clarion_notifications_rejected_total",
    "Sends refused by the API, by error code.",
    ["tenant", "channel", "reason"],
)
OUTCOMES = Counter(
    "clarion_notifications_outcome_total",
    "Outcomes recorded by workers (sent, failed, suppressed, throttled, duplicate, dead, expired, retrying, delayed).",
    ["channel", "provider", "status"],
)
PROVIDER_LATENCY = Histogram(
    "clarion_provider_call_seconds",
    "Provider call latency.",
    ["provider", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
PROVIDER_ERRORS = Counter(
    "clarion_provider_errors_total", "Provider errors by provider and error code.", ["provider", "code"]
)
RETRIES = Counter("clarion_retries_total", "Notifications rescheduled for a later attempt.", ["channel"])
DEDUPED = Counter(
    "clarion_redeliveries_skipped_total",
    "Kafka records that claimed nothing (already sent, leased elsewhere or not due): no provider call.",
    ["channel"],
)
RATELIMIT_DECISIONS = Counter(
    "clarion_ratelimit_decisions_total", "Rate-limit decisions by rule and decision.", ["rule", "decision"]
)
PACING_FACTOR = Gauge(
    "clarion_provider_pacing_factor",
    "Share of its pacing rules' rate a provider gets now (1 nominal; halved by each provider 429, then recovering).",
    ["provider"],
    multiprocess_mode="mostrecent",
)
BREAKER_STATE = Gauge(
    "clarion_breaker_state",
    "Circuit breaker state per provider (0 closed, 1 half-open, 2 open).",
    ["provider"],
    multiprocess_mode="mostrecent",
)
INTERNAL_ERRORS = Counter(
    "clarion_worker_internal_errors_total",
    "Notifications ended by an unexpected exception in the worker (they fail alone), by exception class.",
    ["channel", "exception"],
)
RENDER_DEFERRALS = Counter(
    "clarion_worker_render_deferrals_total",
    "Sends a worker deferred because their tenant's earlier renders held its render turn, by "
    "tenant, channel and decision: deferred (delayed for a later batch), dead (deferred "
    "CLARION_MAX_RENDER_DEFERRALS times already).",
    ["tenant", "channel", "decision"],
)
RATE_LIMIT_RULES_SKIPPED = Gauge(
    "clarion_rate_limit_rules_skipped",
    "Stored rate-limit rules left out at the last load because no limiter can enforce their parameters.",
    multiprocess_mode="mostrecent",
)
POISON = Counter("clarion_poison_messages_total", "Undecodable Kafka records sent to the DLQ.", ["channel"])
REDRIVEN = Counter(
    "clarion_dlq_redriven_total", "Dead notifications re-queued by a DLQ redrive.", ["channel"]
)
RELAY_REPUBLISHED = Counter("clarion_relay_republished_total", "Notifications republished by the relay.")
UNSUBSCRIBES = Counter(
    "clarion_unsubscribes_total", "One-click unsubscribes (RFC 8058) accepted, per tenant.", ["tenant"]
)
PROVIDER_WEBHOOK_EVENTS = Counter(
    "clarion_provider_webhook_events_total",
    "Provider delivery reports received (Twilio status callbacks, SendGrid events), by provider, "
    "provider status/event and result (recorded, duplicate, ignored, unknown, rejected, busy: "
    "refused with 429 callback_busy, a SendGrid batch counted once with event '-').",
    ["provider", "event", "result"],
)
WEBHOOK_CALLS = Counter(
    "clarion_webhook_calls_total",
    "Outbound webhook deliveries taken by `clarion webhooks`, by result: delivered, failed (a call "
    "that got no 2xx), refused (SSRF rule at send, no call), deferred (endpoint breaker open, no call).",
    ["result"],
)
WEBHOOK_ENDPOINTS_DISABLED = Counter(
    "clarion_webhook_endpoints_disabled_total",
    "Webhook endpoints disabled by Clarion after a failure streak.",
)
ENGAGEMENT_EVENTS = Counter(
    "clarion_engagement_events_total",
    "Engagement events counted (replays are not), by the notification's channel and the type "
    "(delivered, bounced, opened, clicked, unsubscribed, complained).",
    ["channel", "type"],
)
TRACKING_HITS_UNRECORDED = Counter(
    "clarion_tracking_hits_unrecorded_total",
    "Email-tracking hits answered but not recorded: busy (the tenant's or the process's turns were "
    "taken) or locked (their engagement row stayed locked); api/engagement_gate.py.",
    ["reason"],
)

# Queue gauges: refreshed from Kafka offsets and the log whenever the API's /metrics is scraped.
CONSUMER_LAG = Gauge(
    "clarion_consumer_lag",
    "Records in a topic partition not yet committed by its consumer group (end offset - committed).",
    ["topic", "partition", "group"],
    multiprocess_mode="mostrecent",
)
TOPIC_END_OFFSET = Gauge(
    "clarion_topic_end_offset",
    "Kafka end offset (next offset to be written) per topic partition.",
    ["topic", "partition"],
    multiprocess_mode="mostrecent",
)
QUEUE_DEPTH = Gauge(
    "clarion_queue_depth",
    "Notifications in the log not yet in a final status (accepted, queued, sending, retrying, delayed, scheduled).",
    ["channel", "lane"],
    multiprocess_mode="mostrecent",
)
OLDEST_UNDELIVERED_AGE = Gauge(
    "clarion_oldest_undelivered_age_seconds",
    "Age of the oldest due notification not yet in a final status (0 when none), from the log.",
    ["channel"],
    multiprocess_mode="mostrecent",
)
OLDEST_WAITING_AGE = Gauge(
    "clarion_oldest_waiting_age_seconds",
    "Age of the oldest due notification not yet in a final status, per lane (0 when none), from the log.",
    ["channel", "lane"],
    multiprocess_mode="mostrecent",
)
DLQ_SIZE = Gauge(
    "clarion_dlq_size",
    "Dead notifications (retries exhausted) waiting for a redrive, from the log.",
    ["channel"],
    multiprocess_mode="mostrecent",
)
LOG_PARTITIONS_AHEAD = Gauge(
    "clarion_log_partitions_ahead",
    "Whole days after today that already have a partition, per log table (0: tomorrow's sends would "
    "land in the default partition). Set by the maintenance loop in the relay.",
    ["table"],
)
LOG_DEFAULT_ROWS = Gauge(
    "clarion_log_default_rows",
    "Rows in a log table's default partition (a day was missing when they arrived; should be 0). "
    "Not set for the tables without one (notifications, notification_keys).",
    ["table"],
)
LOG_PARTITIONS_ON_DEMAND = Counter(
    "clarion_log_partitions_created_on_demand_total",
    "Days of the log a write found missing and this process created (clarion.missing_days; a day "
    "another writer made first is not counted), by the table refused; above 0, the upkeep is not "
    "keeping days ahead.",
    ["table"],
)
LOG_MAINTENANCE_RUN = Gauge(
    "clarion_log_maintenance_last_success_timestamp_seconds",
    "Unix time of the maintenance loop's last successful run in this process.",
)
LAG_READ_ERRORS = Counter(
    "clarion_lag_read_errors_total", "Failed reads of Kafka offsets for the queue gauges."
)

_metrics_server_port: int | None = None


def serve_metrics(port: int | None) -> None:
    """Serve this process's metrics on ``port`` (once per process; ``None``/0: off)."""
    global _metrics_server_port
    if not port or _metrics_server_port is not None:
        return
    from prometheus_client import start_http_server

    start_http_server(port)
    _metrics_server_port = port


COALESCED_BATCH = Histogram(
    "clarion_coalesced_batch_size",
    "Items run together by a group-commit coalescer (accepts per transaction, sandbox rows per insert).",
    ["coalescer"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
