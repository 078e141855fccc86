"""Indexes for provider callbacks (by provider message id) and dead-letter listings"""

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"


def upgrade() -> None:
    # Twilio status callbacks and SendGrid events find their notification by the provider's id.
    op.create_index(
        "ix_notifications_provider_message_id",
        "notifications",
        ["provider_message_id"],
        postgresql_where="provider_message_id IS NOT NULL",
    )
    # /v1/ops/dlq and the DLQ gauges list and count dead notifications per tenant and channel.
    op.create_index(
        "ix_notifications_dead",
        "notifications",
        ["tenant_id", "channel", "updated_at"],
        postgresql_where="status = 'dead'",
    )


def downgrade() -> None:
    op.drop_index("ix_notifications_dead", table_name="notifications")
    op.drop_index("ix_notifications_provider_message_id", table_name="notifications")
