"""Clarion's own email tracking: a tenant's switch and a template version's override (issue #17)"""

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"


def upgrade() -> None:
    op.add_column(
        "tenants", sa.Column("email_tracking", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.add_column("templates", sa.Column("track_email", sa.Boolean(), nullable=True))


def downgrade() -> None:
    op.drop_column("templates", "track_email")
    op.drop_column("tenants", "email_tracking")
