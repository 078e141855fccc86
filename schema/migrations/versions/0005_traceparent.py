"""Keep the W3C traceparent of a notification's accept span, so every publish carries its trace"""

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"


def upgrade() -> None:
    # Nullable without a default: PostgreSQL adds the column without rewriting the table.
    op.add_column("notifications", sa.Column("traceparent", sa.String(length=55), nullable=True))


def downgrade() -> None:
    op.drop_column("notifications", "traceparent")
