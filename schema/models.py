"""The tables of who sends to whom and how: tenants, API keys, users and devices, categories and
preferences, templates, rate-limit rules (SQLModel).

The notification log's tables are in ``schema.log_models``, the outbound webhooks' in
``schema.webhook_models``; Alembic's ``env.py`` imports all three, so one metadata holds the
whole schema. Migrations live in ``schema/migrations`` and are the only way the
schema changes.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlmodel import Field, SQLModel

from schema.ids import uuid7

TS = sa.DateTime(timezone=True)


def now_column(**kw: Any) -> Any:
    """A ``timestamptz NOT NULL DEFAULT now()`` column."""
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
    created_at: datetime | None = Field(default=None, sa_column=now_column())


class ApiKey(SQLModel, table=True):
    __tablename__ = "api_keys"
    id: str = Field(primary_key=True, max_length=32, description="public key id, the part before the dot")
    tenant_id: str = Field(foreign_key="tenants.id", index=True)
    name: str = Field(default="default")
    secret_hash: str = Field(description="sha256 hex of the secret part")
    scopes: list[str] = Field(sa_column=sa.Column(ARRAY(sa.Text), nullable=False))
    created_at: datetime | None = Field(default=None, sa_column=now_column())
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
    created_at: datetime | None = Field(default=None, sa_column=now_column())
    updated_at: datetime | None = Field(default=None, sa_column=now_column())


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
    created_at: datetime | None = Field(default=None, sa_column=now_column())


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
    updated_at: datetime | None = Field(default=None, sa_column=now_column())


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
    created_at: datetime | None = Field(default=None, sa_column=now_column())


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
    created_at: datetime | None = Field(default=None, sa_column=now_column())
    updated_at: datetime | None = Field(default=None, sa_column=now_column())
