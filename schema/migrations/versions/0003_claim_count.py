"""Count the claims of a notification since its last recorded outcome (CLARION_MAX_CLAIMS)"""

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"


def upgrade() -> None:
    # A constant default: PostgreSQL 11+ adds the column without rewriting the table.
    op.add_column("notifications", sa.Column("claims", sa.SmallInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("notifications", "claims")
