"""The notification log and what grows with every send (SQLModel).

The log (``notifications``) is the truth; Kafka only carries work. The tables that grow with
every send (``notifications``, ``delivery_attempts``, ``sandbox_messages``, ``notification_keys``,
``engagement``, ``analytics_hourly``) are range partitioned by one UTC day each (the partition key
is part of every primary key; ``clarion.log_maintenance`` creates the days ahead and drops the
expired ones, see docs/partitioning.md).
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlmodel import Field, SQLModel

from schema.ids import uuid7
from schema.models import TS, now_column


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
    # No foreign keys to tenants and users: a day's drop would have to lock both (migration 0011).
    tenant_id: str
    event_id: str = Field(max_length=255, description="unique per tenant through notification_keys")
    request_hash: str = Field(max_length=64, description="sha256 of the canonical request, for 409 on reuse")
    user_id: uuid.UUID
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
    deferrals: int = Field(
        default=0, sa_column=sa.Column(sa.SmallInteger, nullable=False, server_default="0")
    )
    """Times a worker deferred it for its tenant's busy render turn: past
    ``CLARION_MAX_RENDER_DEFERRALS`` the notification is dead (``workers/render_deferral.py``)."""
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
    created_at: datetime | None = Field(default=None, sa_column=now_column(primary_key=True))
    updated_at: datetime | None = Field(default=None, sa_column=now_column())


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
    created_at: datetime | None = Field(default=None, sa_column=now_column(primary_key=True))


class Engagement(SQLModel, table=True):
    """What happened to a sent notification: one row per (notification, type, link), whoever reported it.

    Range partitioned on ``notification_created_at`` (the notification's own ``created_at``, so a
    day of engagement goes with the same day of the log, docs/partitioning.md); until the
    partition loop runs every row is in ``engagement_default``. No foreign key to the log
    (migration 0012: it made every day's detach check all of engagement while holding the log);
    ``core.engagement`` writes a row only for a notification that is there.
    """

    __tablename__ = "engagement"
    __table_args__ = ({"postgresql_partition_by": "RANGE (notification_created_at)"},)
    # Key order: notification first (the read of one notification's engagement).
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
