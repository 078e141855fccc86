"""Count the render deferrals of a notification (CLARION_MAX_RENDER_DEFERRALS)

A worker defers a send whose tenant's render turn is busy (``render_deferred``); nothing bounded
how often one row could be deferred, each time a claim, a record and two history entries on the
shared log. The record that writes the deferral counts it (``workers/record.py``); the pipeline
ends the row past the bound (``workers/render_deferral.py``).
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"


def upgrade() -> None:
    # A constant default: PostgreSQL 11+ adds the column without rewriting the table.
    op.add_column(
        "notifications", sa.Column("deferrals", sa.SmallInteger(), nullable=False, server_default="0")
    )


def downgrade() -> None:
    op.drop_column("notifications", "deferrals")
