"""Tenants' outbound webhooks: endpoints, the events for them, and each delivery (SQLModel)."""

from __future__ import annotations

import uuid
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlmodel import Field, SQLModel

from schema.ids import uuid7
from schema.models import TS, now_column


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
    created_at: datetime | None = Field(default=None, sa_column=now_column())
    updated_at: datetime | None = Field(default=None, sa_column=now_column())


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
        sa.Index(  # a replay's dedupe and bound (api/webhook_replay.py, migration 0013)
            "ix_webhook_deliveries_pending_endpoint",
            "endpoint_id",
            "event_id",
            postgresql_where=sa.text("state = 'pending'"),
        ),
        sa.Index(  # the claim's walk past a tenant at its share (workers/webhook_claim.py, migration 0014)
            "ix_webhook_deliveries_pending_tenant",
            "tenant_id",
            "next_attempt_at",
            postgresql_where=sa.text("state = 'pending'"),
        ),
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
