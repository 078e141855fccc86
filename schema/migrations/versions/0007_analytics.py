"""Analytics rollups: hourly counts per tenant, channel, template (version), category and provider (issue #17)

Range partitioned on the hour, with a default partition until the partition loop creates days.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"

COUNTS = (
    "accepted", "sent", "failed", "suppressed", "delivered", "bounced", "opened", "clicked",
    "unsubscribed", "complained",
)  # fmt: skip


def upgrade() -> None:
    op.create_table(
        "analytics_hourly",
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("channel", sa.String(length=8), nullable=False),
        sa.Column("template", sa.String(length=128), nullable=False),
        sa.Column("template_version", sa.Integer(), nullable=False),
        sa.Column("category", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=32), nullable=False),
        *(sa.Column(c, sa.BigInteger(), server_default="0", nullable=False) for c in COUNTS),
        sa.PrimaryKeyConstraint(
            "tenant_id", "hour", "channel", "template", "template_version", "category", "provider"
        ),
        postgresql_partition_by="RANGE (hour)",
    )
    op.execute("CREATE TABLE analytics_hourly_default PARTITION OF analytics_hourly DEFAULT")


def downgrade() -> None:
    op.drop_table("analytics_hourly")
