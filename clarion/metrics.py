"""Every Prometheus metric Clarion exports, defined once (``prometheus-client``, default registry).

Each process (API, each worker, relay) exposes its own ``/metrics``; label sets stay small
(tenant, channel, provider, status, reason, rule) so cardinality is bounded by configuration.
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
BREAKER_STATE = Gauge(
    "clarion_breaker_state",
    "Circuit breaker state per provider (0 closed, 1 half-open, 2 open).",
    ["provider"],
)
POISON = Counter("clarion_poison_messages_total", "Undecodable Kafka records sent to the DLQ.", ["channel"])
RELAY_REPUBLISHED = Counter("clarion_relay_republished_total", "Notifications republished by the relay.")
