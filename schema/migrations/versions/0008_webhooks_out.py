"""Outbound webhooks: tenants' endpoints, the event log and the delivery queue (daily partitions)

``webhook_events`` and ``webhook_deliveries`` grow with every send, so both are range partitioned by
day on ``created_at`` (``schema.partitions``); this creates their default partitions, and
``clarion webhooks`` creates the days ahead and drops expired ones (``workers.webhook_retention``).
"""

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0008"
down_revision: str | None = "0007"

_TS = sa.DateTime(timezone=True)


def _str(length: int | None = None) -> sqlmodel.sql.sqltypes.AutoString:
    return sqlmodel.sql.sqltypes.AutoString(length=length)


def upgrade() -> None:
    op.create_table(
        "webhook_endpoints",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", _str(), nullable=False),
        sa.Column("url", _str(2048), nullable=False),
        sa.Column("event_types", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("enabled", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("secret", _str(), nullable=False),
        sa.Column("previous_secret", _str(), nullable=True),
        sa.Column("previous_secret_until", _TS, nullable=True),
        sa.Column("failure_streak", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("failing_since", _TS, nullable=True),
        sa.Column("disabled_reason", _str(), nullable=True),
        sa.Column("disabled_at", _TS, nullable=True),
        sa.Column("created_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_webhook_endpoints_tenant_id", "webhook_endpoints", ["tenant_id"])
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("tenant_id", _str(64), nullable=False),
        sa.Column("notification_id", sa.Uuid(), nullable=True),
        sa.Column("type", _str(64), nullable=False),
        sa.Column("occurred_at", _TS, nullable=False),
        sa.Column("body", _str(), nullable=False),
        sa.PrimaryKeyConstraint("id", "created_at"),
        postgresql_partition_by="RANGE (created_at)",
    )
    op.create_index("ix_webhook_events_tenant_created", "webhook_events", ["tenant_id", "created_at"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("endpoint_id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", _str(64), nullable=False),
        sa.Column("event_id", sa.Uuid(), nullable=False),
        sa.Column("event_type", _str(64), nullable=False),
        sa.Column("body", _str(), nullable=False),
        sa.Column("state", _str(12), nullable=False, server_default="pending"),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("next_attempt_at", _TS, server_default=sa.text("now()"), nullable=False),
        sa.Column("last_attempt_at", _TS, nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", _str(), nullable=True),
        sa.Column("delivered_at", _TS, nullable=True),
        sa.Column("replay", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.PrimaryKeyConstraint("id", "created_at"),
        postgresql_partition_by="RANGE (created_at)",
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index(
        "ix_webhook_deliveries_endpoint_created", "webhook_deliveries", ["endpoint_id", "created_at"]
    )
    # The safety net: a row never fails for want of its day's partition (schema.partitions).
    op.execute("CREATE TABLE webhook_events_default PARTITION OF webhook_events DEFAULT")
    op.execute("CREATE TABLE webhook_deliveries_default PARTITION OF webhook_deliveries DEFAULT")


def downgrade() -> None:
    op.drop_table("webhook_deliveries")  # drops its partitions with it
    op.drop_table("webhook_events")
    op.drop_index("ix_webhook_endpoints_tenant_id", table_name="webhook_endpoints")
    op.drop_table("webhook_endpoints")
