"""The tables of the notification log and everything around it (SQLModel).

The log (``notifications``) is the truth; Kafka only carries work. Migrations live in
``schema/migrations`` and are the only way the schema changes.

The tables that grow with every send (``notifications``, ``delivery_attempts``,
``sandbox_messages``, ``notification_keys``) are range partitioned by one UTC day each (the
partition key is part of every primary key; ``clarion.log_maintenance`` creates the days ahead and
drops the expired ones, see docs/partitioning.md).
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlmodel import Field, SQLModel

from schema.ids import uuid7

TS = sa.DateTime(timezone=True)


def _now_col(**kw: Any) -> Any:
    return sa.Column(TS, server_default=sa.func.now(), nullable=False, **kw)


class Tenant(SQLModel, table=True):
    __tablename__ = "tenants"
    id: str = Field(primary_key=True, max_length=64)
    name: str
    default_locale: str = Field(default="en", max_length=35)
    content_dedupe_window_s: int | None = Field(default=None)
    email_tracking: bool = Field(
        default=False,
        sa_column_kwargs={"server_default": sa.false()},
        description="Clarion's own email tracking",
    )
    created_at: datetime | None = Field(default=None, sa_column=_now_col())


class ApiKey(SQLModel, table=True):
    __tablename__ = "api_keys"
    id: str = Field(primary_key=True, max_length=32, description="public key id, the part before the dot")
    tenant_id: str = Field(foreign_key="tenants.id", index=True)
    name: str = Field(default="default")
    secret_hash: str = Field(description="sha256 hex of the secret part")
    scopes: list[str] = Field(sa_column=sa.Column(ARRAY(sa.Text), nullable=False))
    created_at: datetime | None = Field(default=None, sa_column=_now_col())
    revoked_at: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))


class User(SQLModel, table=True):
    __tablename__ = "users"
    __table_args__ = (sa.UniqueConstraint("tenant_id", "external_id", name="uq_users_tenant_external"),)
    id: uuid.UUID = Field(default_factory=uuid7, primary_key=True)
    tenant_id: str = Field(foreign_key="tenants.id")
    external_id: str = Field(max_length=255)
    email: str | None = None
    phone: str | None = Field(default=None, max_length=16)
    locale: str | None = Field(default=None, max_length=35)
    timezone: str | None = Field(default=None, max_length=64)
    quiet_hours_start: str | None = Field(default=None, max_length=5, description="HH:MM local time")
    quiet_hours_end: str | None = Field(default=None, max_length=5, description="HH:MM local time")
    created_at: datetime | None = Field(default=None, sa_column=_now_col())
    updated_at: datetime | None = Field(default=None, sa_column=_now_col())


class Device(SQLModel, table=True):
    __tablename__ = "devices"
    __table_args__ = (sa.UniqueConstraint("user_id", "platform", "token", name="uq_devices_user_token"),)
    id: uuid.UUID = Field(default_factory=uuid7, primary_key=True)
    user_id: uuid.UUID = Field(foreign_key="users.id", index=True)
    platform: str = Field(max_length=8)
    token: str = Field(max_length=4096)
    active: bool = Field(default=True)
    last_error: str | None = None
    deactivated_at: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    created_at: datetime | None = Field(default=None, sa_column=_now_col())


class Category(SQLModel, table=True):
    __tablename__ = "categories"
    tenant_id: str = Field(foreign_key="tenants.id", primary_key=True)
    name: str = Field(primary_key=True, max_length=64)
    default_opted_in: bool = Field(default=True)
    required: bool = Field(default=False, description="cannot be opted out of (security alerts, OTPs)")
    email_quiet_hours: bool = Field(default=False, description="hold email in quiet hours too")


class Preference(SQLModel, table=True):
    __tablename__ = "preferences"
    user_id: uuid.UUID = Field(foreign_key="users.id", primary_key=True)
    channel: str = Field(primary_key=True, max_length=8, description="'*' for every channel")
    category: str = Field(primary_key=True, max_length=64, description="'*' for every category")
    opted_in: bool
    updated_at: datetime | None = Field(default=None, sa_column=_now_col())


class Template(SQLModel, table=True):
    __tablename__ = "templates"
    __table_args__ = (
        sa.UniqueConstraint("tenant_id", "name", "channel", "locale", "version", name="uq_templates_version"),
        sa.Index("ix_templates_lookup", "tenant_id", "name", "channel", "locale"),
    )
    id: uuid.UUID = Field(default_factory=uuid7, primary_key=True)
    tenant_id: str = Field(foreign_key="tenants.id")
    name: str = Field(max_length=128)
    channel: str = Field(max_length=8)
    locale: str = Field(default="en", max_length=35)
    version: int = Field(default=1)
    active: bool = Field(default=True)
    subject: str | None = Field(default=None, description="email subject or push title")
    body: str = Field(description="text body")
    html: str | None = Field(default=None, description="email HTML body")
    track_email: bool | None = Field(
        default=None, description="email tracking for this version; None: the tenant's"
    )
    sample_data: dict[str, Any] | None = Field(default=None, sa_column=sa.Column(JSONB, nullable=True))
    created_at: datetime | None = Field(default=None, sa_column=_now_col())


class Notification(SQLModel, table=True):
    __tablename__ = "notifications"
    __table_args__ = (
        sa.Index("ix_notifications_tenant_created", "tenant_id", "created_at"),
        sa.Index("ix_notifications_user_created", "user_id", "created_at"),
        sa.Index(
            "ix_notifications_pending",
            "status",
            "not_before",
            postgresql_where=sa.text(
                "status IN ('accepted','queued','sending','retrying','delayed','scheduled')"
            ),
        ),
        sa.Index(
            "ix_notifications_provider_message_id",
            "provider_message_id",
            postgresql_where=sa.text("provider_message_id IS NOT NULL"),
        ),
        sa.Index(
            "ix_notifications_dead",
            "tenant_id",
            "channel",
            "updated_at",
            postgresql_where=sa.text("status = 'dead'"),
        ),
        sa.Index(
            "ix_notifications_content",
            "user_id",
            "channel",
            "content_hash",
            postgresql_where=sa.text("content_hash IS NOT NULL"),
        ),
        {"postgresql_partition_by": "RANGE (created_at)"},
    )
    id: uuid.UUID = Field(default_factory=uuid7, primary_key=True)
    tenant_id: str = Field(foreign_key="tenants.id")
    event_id: str = Field(max_length=255, description="unique per tenant through notification_keys")
    request_hash: str = Field(max_length=64, description="sha256 of the canonical request, for 409 on reuse")
    user_id: uuid.UUID = Field(foreign_key="users.id")
    channel: str = Field(max_length=8)
    category: str = Field(default="general", max_length=64)
    priority: str = Field(default="normal", max_length=8)
    template: str | None = Field(default=None, max_length=128)
    template_version: int | None = None
    locale: str | None = Field(default=None, max_length=35)
    content: dict[str, Any] | None = Field(default=None, sa_column=sa.Column(JSONB, nullable=True))
    data: dict[str, Any] = Field(default_factory=dict, sa_column=sa.Column(JSONB, nullable=False))
    send_at: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    expires_at: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    status: str = Field(default="accepted", max_length=12)
    attempts: int = Field(default=0)
    claims: int = Field(default=0, sa_column=sa.Column(sa.SmallInteger, nullable=False, server_default="0"))
    """Claims since the last recorded outcome: past ``CLARION_MAX_CLAIMS`` the notification is dead."""
    lease_until: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    not_before: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    provider: str | None = Field(default=None, max_length=32)
    provider_message_id: str | None = None
    error_code: str | None = Field(default=None, max_length=64)
    error_message: str | None = None
    content_hash: str | None = Field(default=None, max_length=64)
    traceparent: str | None = Field(default=None, max_length=55)
    """The W3C trace context of the notification's accept span, when the API traced it: the
    relay republishes it with the message, so a worker's spans continue the same trace."""
    history: list[dict[str, Any]] = Field(
        default_factory=list, sa_column=sa.Column(JSONB, nullable=False, server_default="[]")
    )
    published_at: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    """When the message last went to the broker (the outbox, or the relay republishing it)."""
    queued_at: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    """When the broker first acknowledged it: an ``accepted`` row with this set shows as ``queued``
    (schema/shown_status.py), so reaching the broker leaves ``status`` and its index alone."""
    created_at: datetime | None = Field(default=None, sa_column=_now_col(primary_key=True))
    updated_at: datetime | None = Field(default=None, sa_column=_now_col())


class NotificationKey(SQLModel, table=True):
    """An event id's first use: what makes ``event_id`` unique per tenant across the log's days.

    PostgreSQL cannot enforce ``UNIQUE (tenant_id, event_id)`` on a table partitioned by time;
    the accept path looks a key up over every kept day, under a transaction-scoped advisory lock
    per key (``api.accept``). A day's keys expire with its partition (``CLARION_RETENTION_DAYS``).
    """

    __tablename__ = "notification_keys"
    __table_args__ = ({"postgresql_partition_by": "RANGE (day)"},)
    tenant_id: str = Field(primary_key=True)
    event_id: str = Field(primary_key=True, max_length=255)
    day: date = Field(primary_key=True, description="UTC day of the first use (the partition key)")
    notification_id: uuid.UUID
    request_hash: str = Field(max_length=64)


class DeliveryAttempt(SQLModel, table=True):
    __tablename__ = "delivery_attempts"
    __table_args__ = ({"postgresql_partition_by": "RANGE (started_at)"},)
    id: int | None = Field(default=None, primary_key=True)
    notification_id: uuid.UUID = Field(index=True)
    attempt: int
    provider: str = Field(max_length=32)
    recipient: str | None = Field(default=None, description="device token / address hash this call went to")
    started_at: datetime = Field(sa_column=sa.Column(TS, nullable=False, primary_key=True))
    finished_at: datetime = Field(sa_column=sa.Column(TS, nullable=False))
    outcome: str = Field(max_length=32, description="sent | transient | permanent | invalid_recipient")
    error_code: str | None = Field(default=None, max_length=64)
    error_message: str | None = None
    http_status: int | None = None
    provider_message_id: str | None = None


class Engagement(SQLModel, table=True):
    """What happened to a sent notification: one row per (notification, type, link), whoever reported it.

    Range partitioned on ``notification_created_at`` (the notification's own ``created_at``, so a
    day of engagement goes with the same day of the log, docs/partitioning.md); until the
    partition loop runs every row is in ``engagement_default``, and the foreign key deletes the
    rows with their notification.
    """

    __tablename__ = "engagement"
    __table_args__ = (
        # Composite: a key referenced on the partitioned log must include its partition key.
        sa.ForeignKeyConstraint(
            ["notification_id", "notification_created_at"],
            ["notifications.id", "notifications.created_at"],
            name="engagement_notification_fkey",
            ondelete="CASCADE",
        ),
        {"postgresql_partition_by": "RANGE (notification_created_at)"},
    )
    # Key order: notification first (the read of one notification, and the cascade from it).
    notification_id: uuid.UUID = Field(sa_column=sa.Column(sa.Uuid, primary_key=True, nullable=False))
    type: str = Field(primary_key=True, max_length=12, description="schema.enums.EngagementType")
    link: str = Field(
        default="",
        sa_column=sa.Column(sa.Text, primary_key=True, nullable=False, server_default=""),
        description="the clicked URL ('' for every other type)",
    )
    tenant_id: str = Field(primary_key=True, max_length=64)
    notification_created_at: datetime = Field(sa_column=sa.Column(TS, primary_key=True, nullable=False))
    first_at: datetime = Field(sa_column=sa.Column(TS, nullable=False))
    last_at: datetime = Field(sa_column=sa.Column(TS, nullable=False))
    count: int = Field(default=1, sa_column=sa.Column(sa.Integer, nullable=False, server_default="1"))
    source: str = Field(max_length=16, description="who reported it first: twilio, sendgrid, api, device")
    seen: list[str] = Field(
        default_factory=list,
        sa_column=sa.Column(ARRAY(sa.Text), nullable=False, server_default="{}"),
        description="markers of the latest reports counted (provider event ids): a replay is not counted twice",
    )


class RateLimitRule(SQLModel, table=True):
    __tablename__ = "rate_limit_rules"
    id: uuid.UUID = Field(default_factory=uuid7, primary_key=True)
    tenant_id: str | None = Field(default=None, foreign_key="tenants.id", index=True)
    name: str = Field(default="", max_length=128)
    scope: str = Field(max_length=16, description="tenant | api_key | recipient | provider")
    channel: str | None = Field(default=None, max_length=8)
    category: str | None = Field(default=None, max_length=64)
    provider: str | None = Field(default=None, max_length=32)
    limit: int = Field(description="events allowed per period")
    period_s: float
    burst: int = Field(default=0, description="extra events allowed at once above the steady rate")
    mode: str = Field(default="hard", max_length=8, description="hard | soft | elastic")
    overshoot_pct: float = Field(default=0.0)
    action: str = Field(default="delay", max_length=8, description="reject | delay | drop")
    enabled: bool = Field(default=True)
    created_at: datetime | None = Field(default=None, sa_column=_now_col())
    updated_at: datetime | None = Field(default=None, sa_column=_now_col())


class SandboxMessage(SQLModel, table=True):
    __tablename__ = "sandbox_messages"
    __table_args__ = ({"postgresql_partition_by": "RANGE (created_at)"},)
    id: int | None = Field(default=None, primary_key=True)
    notification_id: uuid.UUID = Field(index=True)
    tenant_id: str = Field(index=True)
    channel: str
    recipient: str
    subject: str | None = None
    body: str
    html: str | None = None
    data: dict[str, Any] = Field(default_factory=dict, sa_column=sa.Column(JSONB, nullable=False))
    provider_message_id: str
    created_at: datetime | None = Field(default=None, sa_column=_now_col(primary_key=True))


class AnalyticsHourly(SQLModel, table=True):
    """Hourly counts per tenant, channel, template (version), category and provider, kept up to
    date as notifications are accepted, end and are engaged with (``core.analytics``).

    Range partitioned on ``hour`` (the hour a notification was accepted) so it ages out by whole
    days with the log; a few rows per tenant and hour, not one per notification.
    """

    __tablename__ = "analytics_hourly"
    __table_args__ = ({"postgresql_partition_by": "RANGE (hour)"},)
    tenant_id: str = Field(primary_key=True, max_length=64)
    hour: datetime = Field(sa_column=sa.Column(TS, primary_key=True, nullable=False))
    channel: str = Field(primary_key=True, max_length=8)
    template: str = Field(default="", primary_key=True, max_length=128, description="'' for inline content")
    template_version: int = Field(default=0, primary_key=True)
    category: str = Field(default="", primary_key=True, max_length=64)
    provider: str = Field(
        default="", primary_key=True, max_length=32, description="'' before a provider is known"
    )
    accepted: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0"))
    sent: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0"))
    failed: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0"))
    suppressed: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0"))
    delivered: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0"))
    bounced: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0"))
    opened: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0"))
    clicked: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0"))
    unsubscribed: int = Field(
        default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0")
    )
    complained: int = Field(default=0, sa_column=sa.Column(sa.BigInteger, nullable=False, server_default="0"))


class WebhookEndpoint(SQLModel, table=True):
    """A tenant's receiver of outbound webhooks (Standard Webhooks signed)."""

    __tablename__ = "webhook_endpoints"
    id: uuid.UUID = Field(default_factory=uuid7, primary_key=True)
    tenant_id: str = Field(foreign_key="tenants.id", index=True)
    url: str = Field(max_length=2048)
    event_types: list[str] = Field(sa_column=sa.Column(ARRAY(sa.Text), nullable=False))
    enabled: bool = Field(default=True)
    secret: str = Field(description="whsec_<base64>: signs every payload; shown to the tenant once")
    previous_secret: str | None = Field(default=None, description="the secret before a rotation")
    previous_secret_until: datetime | None = Field(
        default=None,
        sa_column=sa.Column(TS, nullable=True),
        description="payloads carry both signatures until then",
    )
    failure_streak: int = Field(default=0, description="failed calls since the last success")
    failing_since: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    disabled_reason: str | None = Field(default=None, description="why Clarion disabled it (shown on GET)")
    disabled_at: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    created_at: datetime | None = Field(default=None, sa_column=_now_col())
    updated_at: datetime | None = Field(default=None, sa_column=_now_col())


class WebhookEvent(SQLModel, table=True):
    """One event in a tenant's webhook log (what a replay resends). Daily partitions on created_at."""

    __tablename__ = "webhook_events"
    __table_args__ = (
        sa.Index("ix_webhook_events_tenant_created", "tenant_id", "created_at"),
        {"postgresql_partition_by": "RANGE (created_at)"},
    )
    id: uuid.UUID = Field(primary_key=True, description="UUIDv7; the webhook-id header of every delivery")
    created_at: datetime = Field(
        sa_column=sa.Column(TS, server_default=sa.func.now(), nullable=False, primary_key=True)
    )
    tenant_id: str = Field(max_length=64)
    notification_id: uuid.UUID | None = None
    type: str = Field(max_length=64)
    occurred_at: datetime = Field(sa_column=sa.Column(TS, nullable=False))
    body: str = Field(description="the exact JSON text that is signed and sent")


class WebhookDelivery(SQLModel, table=True):
    """One event to one endpoint: the unit that is claimed, sent, retried. Daily partitions on created_at."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        sa.Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=sa.text("state = 'pending'"),
        ),
        sa.Index("ix_webhook_deliveries_endpoint_created", "endpoint_id", "created_at"),
        {"postgresql_partition_by": "RANGE (created_at)"},
    )
    id: uuid.UUID = Field(primary_key=True)
    created_at: datetime = Field(
        sa_column=sa.Column(TS, server_default=sa.func.now(), nullable=False, primary_key=True)
    )
    endpoint_id: uuid.UUID
    tenant_id: str = Field(max_length=64)
    event_id: uuid.UUID
    event_type: str = Field(max_length=64)
    body: str
    state: str = Field(
        default="pending", max_length=12, description="pending | delivered | failed | cancelled"
    )
    attempts: int = Field(default=0)
    next_attempt_at: datetime = Field(sa_column=sa.Column(TS, server_default=sa.func.now(), nullable=False))
    last_attempt_at: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    last_status: int | None = Field(default=None, description="HTTP status of the last call, if it got one")
    last_error: str | None = None
    delivered_at: datetime | None = Field(default=None, sa_column=sa.Column(TS, nullable=True))
    replay: bool = Field(default=False, description="made by a replay request")
