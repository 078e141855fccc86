"""Clarion's own email tracking: a tenant's switch and a template version's override (issue #17)

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tenants", sa.Column("email_tracking", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.add_column("templates", sa.Column("track_email", sa.Boolean(), nullable=True))


def downgrade() -> None:
    op.drop_column("templates", "track_email")
    op.drop_column("tenants", "email_tracking")
