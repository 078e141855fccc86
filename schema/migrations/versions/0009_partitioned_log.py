"""The notification log partitioned by day, and the idempotency keys in a table of their own (#16)

Every row is kept: each growing table is renamed ``*_old``, rebuilt as a table range partitioned
by its time column (the partition key in its primary key), given one partition per day its rows
cover plus today .. today + 7 and a default partition, filled with ``INSERT ... SELECT`` and the
old table dropped. The serial sequences move over to the new tables, so ids carry on.

``(tenant_id, event_id)`` cannot stay unique on a table partitioned by time: the keys move to
``notification_keys``, partitioned by ``day`` (see api/accept.py and docs/partitioning.md).
``delivery_attempts`` loses its foreign key to ``notifications`` (a referenced key must include
the partition key); attempts are written only by the worker holding the notification's claim.

``engagement`` and ``analytics_hourly`` (partitioned from their first migration, every row still
in their default partition) get their day partitions too, and engagement's foreign key becomes
composite, ``(notification_id, notification_created_at) -> notifications (id, created_at)``.

Downgrade copies every row back; it fails if an event id was used twice after the upgrade (once a
day's keys expired), as the old unique constraint would refuse it.
"""

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"

DAYS_AHEAD = 7
# table -> (partition key, the day of a row in SQL, primary key)
LOG = {
    "notifications": ("created_at", "(created_at AT TIME ZONE 'UTC')::date", "id, created_at"),
    "delivery_attempts": ("started_at", "(started_at AT TIME ZONE 'UTC')::date", "id, started_at"),
    "sandbox_messages": ("created_at", "(created_at AT TIME ZONE 'UTC')::date", "id, created_at"),
}
INDEXES = {
    "notifications": [
        "CREATE INDEX ix_notifications_tenant_created ON notifications (tenant_id, created_at)",
        "CREATE INDEX ix_notifications_user_created ON notifications (user_id, created_at)",
        "CREATE INDEX ix_notifications_pending ON notifications (status, not_before) WHERE status IN "
        "('accepted','queued','sending','retrying','delayed','scheduled')",
        "CREATE INDEX ix_notifications_provider_message_id ON notifications (provider_message_id) "
        "WHERE provider_message_id IS NOT NULL",
        "CREATE INDEX ix_notifications_dead ON notifications (tenant_id, channel, updated_at) "
        "WHERE status = 'dead'",
        "CREATE INDEX ix_notifications_content ON notifications (user_id, channel, content_hash) "
        "WHERE content_hash IS NOT NULL",
    ],
    "delivery_attempts": [
        "CREATE INDEX ix_delivery_attempts_notification_id ON delivery_attempts (notification_id)"
    ],
    "sandbox_messages": [
        "CREATE INDEX ix_sandbox_messages_notification_id ON sandbox_messages (notification_id)",
        "CREATE INDEX ix_sandbox_messages_tenant_id ON sandbox_messages (tenant_id)",
    ],
}
# Partitioned already, with only a default partition: their rows move into day partitions.
SPLIT = {"engagement": "notification_created_at", "analytics_hourly": "hour"}
SEQUENCES = {"delivery_attempts": "delivery_attempts_id_seq", "sandbox_messages": "sandbox_messages_id_seq"}
FOREIGN_KEYS = {
    "notifications": [
        "ALTER TABLE notifications ADD CONSTRAINT notifications_tenant_id_fkey "
        "FOREIGN KEY (tenant_id) REFERENCES tenants (id)",
        "ALTER TABLE notifications ADD CONSTRAINT notifications_user_id_fkey "
        "FOREIGN KEY (user_id) REFERENCES users (id)",
    ],
}


def _partition(parent: str, day: dt.date) -> str:
    return f"{parent}_p{str(day).replace('-', '')}"


def _create_partitions(parent: str, days: list[dt.date]) -> None:
    op.execute(f"CREATE TABLE {parent}_default PARTITION OF {parent} DEFAULT")
    for day in days:
        op.execute(
            f"CREATE TABLE {_partition(parent, day)} PARTITION OF {parent} FOR VALUES "
            f"FROM ('{day} 00:00:00+00') TO ('{day + dt.timedelta(days=1)} 00:00:00+00')"
        )


def _days(bind: sa.Connection, queries: list[str]) -> list[dt.date]:
    union = " UNION ".join(queries)
    sql = (
        f"SELECT DISTINCT d FROM ({union} UNION SELECT (now() AT TIME ZONE 'UTC')::date + g "
        f"FROM generate_series(0, {DAYS_AHEAD}) g) AS days(d) ORDER BY d"
    )
    return [row[0] for row in bind.execute(sa.text(sql))]


def upgrade() -> None:
    bind = op.get_bind()
    op.execute(
        "ALTER TABLE delivery_attempts DROP CONSTRAINT IF EXISTS delivery_attempts_notification_id_fkey"
    )
    op.execute("ALTER TABLE engagement DROP CONSTRAINT IF EXISTS engagement_notification_id_fkey")
    for table in SPLIT:
        op.execute(f"ALTER TABLE {table} DETACH PARTITION {table}_default")
        op.execute(f"ALTER TABLE {table}_default RENAME TO {table}_old")
    op.execute("ALTER TABLE notifications DROP CONSTRAINT uq_notifications_event")
    for table, (key, _, pk) in LOG.items():
        op.execute(f"ALTER TABLE {table} RENAME TO {table}_old")
        op.execute(f"ALTER TABLE {table}_old DROP CONSTRAINT {table}_pkey")
        for statement in INDEXES[table]:
            op.execute(f"DROP INDEX {statement.split()[2]}")
        op.execute(
            f"CREATE TABLE {table} (LIKE {table}_old INCLUDING DEFAULTS, PRIMARY KEY ({pk})) "
            f"PARTITION BY RANGE ({key})"
        )
    days = _days(
        bind,
        [f"SELECT {day} FROM {table}_old" for table, (_, day, _) in LOG.items()]
        + [f"SELECT ({key} AT TIME ZONE 'UTC')::date FROM {table}_old" for table, key in SPLIT.items()],
    )
    op.execute(
        """CREATE TABLE notification_keys (
               tenant_id VARCHAR NOT NULL,
               event_id VARCHAR(255) NOT NULL,
               day DATE NOT NULL,
               notification_id UUID NOT NULL,
               request_hash VARCHAR(64) NOT NULL,
               PRIMARY KEY (tenant_id, event_id, day)
           ) PARTITION BY RANGE (day)"""
    )
    for table in [*LOG, "notification_keys", *SPLIT]:
        _create_partitions(table, days)
    for table in [*LOG, *SPLIT]:
        op.execute(f"INSERT INTO {table} SELECT * FROM {table}_old")
    for table in SPLIT:
        op.execute(f"DROP TABLE {table}_old")
    op.execute(
        "INSERT INTO notification_keys (tenant_id, event_id, day, notification_id, request_hash) "
        "SELECT tenant_id, event_id, (created_at AT TIME ZONE 'UTC')::date, id, request_hash "
        "FROM notifications_old"
    )
    for sequence in SEQUENCES.values():
        op.execute(f"ALTER SEQUENCE {sequence} OWNED BY NONE")
    for table in LOG:
        op.execute(f"DROP TABLE {table}_old")
        for statement in [*INDEXES[table], *FOREIGN_KEYS.get(table, [])]:
            op.execute(statement)
    for table, sequence in SEQUENCES.items():
        op.execute(f"ALTER SEQUENCE {sequence} OWNED BY {table}.id")
    op.execute(
        "ALTER TABLE engagement ADD CONSTRAINT engagement_notification_fkey FOREIGN KEY "
        "(notification_id, notification_created_at) REFERENCES notifications (id, created_at) ON DELETE CASCADE"
    )
    op.execute(
        "ANALYZE notifications, delivery_attempts, sandbox_messages, notification_keys, engagement, analytics_hourly"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE engagement DROP CONSTRAINT engagement_notification_fkey")
    for table in LOG:
        op.execute(f"ALTER TABLE {table} RENAME TO {table}_part")
        op.execute(f"ALTER TABLE {table}_part DROP CONSTRAINT {table}_pkey")
        for statement in INDEXES[table]:
            op.execute(f"DROP INDEX {statement.split()[2]}")
        op.execute(f"CREATE TABLE {table} (LIKE {table}_part INCLUDING DEFAULTS, PRIMARY KEY (id))")
        op.execute(f"INSERT INTO {table} SELECT * FROM {table}_part")
    for sequence in SEQUENCES.values():
        op.execute(f"ALTER SEQUENCE {sequence} OWNED BY NONE")
    for table in LOG:
        op.execute(f"DROP TABLE {table}_part")
        for statement in [*INDEXES[table], *FOREIGN_KEYS.get(table, [])]:
            op.execute(statement)
    for table, sequence in SEQUENCES.items():
        op.execute(f"ALTER SEQUENCE {sequence} OWNED BY {table}.id")
    op.execute("DROP TABLE notification_keys")
    op.execute("ALTER TABLE notifications ADD CONSTRAINT uq_notifications_event UNIQUE (tenant_id, event_id)")
    op.execute(
        "ALTER TABLE delivery_attempts ADD CONSTRAINT delivery_attempts_notification_id_fkey "
        "FOREIGN KEY (notification_id) REFERENCES notifications (id)"
    )
    op.execute(
        "ALTER TABLE engagement ADD CONSTRAINT engagement_notification_id_fkey "
        "FOREIGN KEY (notification_id) REFERENCES notifications (id) ON DELETE CASCADE"
    )
