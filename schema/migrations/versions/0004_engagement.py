"""Engagement: one row per (notification, type, link) with first/last time and count (issue #17)

Range partitioned on the notification's created_at so a day of engagement can be dropped with the
same day of the log once the partition loop runs (docs/partitioning.md); the default partition
holds every row until then, and the foreign key deletes them with their notification.
"""

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0004"
down_revision: str | None = "0003"


def upgrade() -> None:
    op.create_table(
        "engagement",
        sa.Column("notification_id", sa.Uuid(), nullable=False),
        sa.Column("type", sqlmodel.sql.sqltypes.AutoString(length=12), nullable=False),
        sa.Column("link", sa.Text(), server_default="", nullable=False),
        sa.Column("tenant_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("notification_created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("first_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.Integer(), server_default="1", nullable=False),
        sa.Column("source", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("seen", postgresql.ARRAY(sa.Text()), server_default="{}", nullable=False),
        sa.ForeignKeyConstraint(["notification_id"], ["notifications.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("notification_id", "type", "link", "tenant_id", "notification_created_at"),
        postgresql_partition_by="RANGE (notification_created_at)",
    )
    # The safety net: a row never fails for want of a day partition (schema.partitions).
    op.execute("CREATE TABLE engagement_default PARTITION OF engagement DEFAULT")


def downgrade() -> None:
    op.drop_table("engagement")  # its partitions go with it
