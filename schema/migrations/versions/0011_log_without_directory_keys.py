"""The log's day partitions stop referencing ``users`` and ``tenants`` (#16)

A foreign key from ``notifications`` to ``users`` and ``tenants`` is cloned onto every day
partition. Dropping an expired day then has to take ``users`` and ``tenants`` (detaching turns the
clone into the day's own key, with triggers on both; dropping the day removes them), while every
accept holds ``users`` and waits for ``notifications``: ``bench.growth`` saw PostgreSQL cancel one
side of that deadlock in each of five runs, once an accept (HTTP 500). Without the keys a day's
drop touches only the log (docs/partitioning.md, "Retention under load").

What the keys guarded is kept by the accept path itself: it writes the user (upsert) and the
notification in one transaction, for the tenant it authenticated, and nothing deletes a user or
a tenant. Each insert also no longer runs the two key checks (``SELECT ... FOR KEY SHARE`` on the
user, one WAL record each, and on the tenant).
"""

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"


def upgrade() -> None:
    op.execute("ALTER TABLE notifications DROP CONSTRAINT notifications_tenant_id_fkey")
    op.execute("ALTER TABLE notifications DROP CONSTRAINT notifications_user_id_fkey")


def downgrade() -> None:
    op.execute(
        "ALTER TABLE notifications ADD CONSTRAINT notifications_tenant_id_fkey "
        "FOREIGN KEY (tenant_id) REFERENCES tenants (id)"
    )
    op.execute(
        "ALTER TABLE notifications ADD CONSTRAINT notifications_user_id_fkey "
        "FOREIGN KEY (user_id) REFERENCES users (id)"
    )
