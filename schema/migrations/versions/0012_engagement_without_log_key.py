"""``engagement`` stops referencing ``notifications`` by a foreign key (#16, the drop's blip)

Detaching a day of ``notifications`` made PostgreSQL check that no ``engagement`` row in any other
day still referenced it: a join of the day's rows against all of ``engagement``, run while the
detach held ``notifications`` in ACCESS EXCLUSIVE, so every accept waited for it (``bench.growth``
at 20 M rows: 131 ms for the detach, the probe's slowest accept 140 ms against a p99 of 48.5 ms;
the same detach without the key, 0.2 ms on a copy of its shape). Dropping the detached engagement
day's own copy of the key also took ``notifications`` in SHARE ROW EXCLUSIVE.

What the key guarded is kept without it: engagement is written only by
``core.engagement.record_engagement``, whose upsert inserts nothing unless the notification is
there (in the same statement), and a day of ``engagement`` is dropped with the same day of
``notifications`` (``clarion.log_maintenance``, ``goes_with_log``); nothing deletes a
notification row by row, so the cascade had nothing left to do.
"""

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"


def upgrade() -> None:
    op.execute("ALTER TABLE engagement DROP CONSTRAINT engagement_notification_fkey")


def downgrade() -> None:
    op.execute(
        "ALTER TABLE engagement ADD CONSTRAINT engagement_notification_fkey FOREIGN KEY "
        "(notification_id, notification_created_at) REFERENCES notifications (id, created_at) ON DELETE CASCADE"
    )
