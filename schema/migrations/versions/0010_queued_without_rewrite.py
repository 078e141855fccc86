"""Reaching the broker no longer rewrites the log row (#16)

``notifications.queued_at`` records when the broker acknowledged a notification's message. The
outbox used to turn ``accepted`` into ``queued`` and append to ``history``: a new row version
with a new entry in every index (``status`` is indexed), one of the four a send wrote. Setting
``queued_at`` and ``published_at`` touches no indexed column, so PostgreSQL makes it a HOT update
when the page has room: the day partitions of ``notifications`` get ``fillfactor = 80`` for that
room (docs/partitioning.md, "Fill factor"). ``GET /v1/notifications/{id}`` still shows ``queued``
and its history entry, derived from ``queued_at`` (schema/shown_status.py).

Rows already ``queued`` stay as they are; they read the same.
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"

FILLFACTOR = 80
_PARTITIONS = """
SELECT c.relname FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid
  JOIN pg_class p ON p.oid = i.inhparent
 WHERE p.relname = 'notifications'
"""


def _partitions() -> list[str]:
    return [row[0] for row in op.get_bind().execute(sa.text(_PARTITIONS))]


def upgrade() -> None:
    op.add_column("notifications", sa.Column("queued_at", sa.DateTime(timezone=True), nullable=True))
    for name in _partitions():
        op.execute(f"ALTER TABLE {name} SET (fillfactor = {FILLFACTOR})")


def downgrade() -> None:
    op.execute(
        "UPDATE notifications SET status = 'queued' WHERE status = 'accepted' AND queued_at IS NOT NULL"
    )
    for name in _partitions():
        op.execute(f"ALTER TABLE {name} RESET (fillfactor)")
    op.drop_column("notifications", "queued_at")
