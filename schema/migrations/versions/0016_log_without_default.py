"""The tables the accept writes lose their default partition, so a day can be detached CONCURRENTLY

Detaching a day of a table with a default partition takes ACCESS EXCLUSIVE on the parent: every
accept queues behind it and it waits for every accept in flight (the blip of issue #16, README,
"bench.drop_blip"). PostgreSQL refuses ``DETACH PARTITION ... CONCURRENTLY`` while a table has a
default partition, so ``notifications`` and ``notification_keys`` drop theirs; a send whose day is
missing now has its day created on demand (``clarion.missing_days``).

Every row is kept: the default partition is detached, a one-day partition is made for each day its
rows fall on (no partition covers such a day: PostgreSQL keeps a partition's rows out of the
default), the day's rows are copied into it before it is attached, and the old default is dropped
once every one of its rows is counted in the table again; all in the migration's transaction.
Downgrade gives the tables an empty default partition back.
"""

import datetime as dt

from alembic import op
from sqlalchemy import text

revision: str = "0016"
down_revision: str | None = "0015"

# table -> (the UTC day of a row in SQL, the fill factor of its day partitions, as the upkeep makes
# them: clarion.log_maintenance.LOG_TABLES)
TABLES = {
    "notifications": ("(created_at AT TIME ZONE 'UTC')::date", 80),
    "notification_keys": ("day", 100),
}
# Detaching the default takes ACCESS EXCLUSIVE on the table: waiting long behind a reader would
# queue every send behind the migration. It gives up instead, changing nothing; run it again.
LOCK_TIMEOUT = "5s"


def _instant(day: dt.date) -> str:
    return f"'{day.isoformat()} 00:00:00+00'"


def upgrade() -> None:
    bind = op.get_bind()
    op.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
    for table, (day_of, fillfactor) in TABLES.items():
        if bind.execute(text("SELECT to_regclass(:name)"), {"name": f"{table}_default"}).scalar() is None:
            continue
        before = bind.execute(text(f"SELECT count(*) FROM {table}")).scalar()
        op.execute(f"ALTER TABLE {table} DETACH PARTITION {table}_default")
        days = list(bind.execute(text(f"SELECT DISTINCT {day_of} FROM {table}_default ORDER BY 1")).scalars())
        for day in days:
            name = f"{table}_p{day:%Y%m%d}"
            op.execute(
                f"CREATE TABLE {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
                f" WITH (fillfactor = {fillfactor})"
            )
            op.execute(
                f"INSERT INTO {name} SELECT * FROM {table}_default WHERE {day_of} = '{day.isoformat()}'"
            )
            op.execute(
                f"ALTER TABLE {table} ATTACH PARTITION {name}"
                f" FOR VALUES FROM ({_instant(day)}) TO ({_instant(day + dt.timedelta(days=1))})"
            )
        after = bind.execute(text(f"SELECT count(*) FROM {table}")).scalar()
        if after != before:  # never: every day of the default got its partition
            raise RuntimeError(f"{table}: {before} rows before, {after} after; nothing changed")
        op.execute(f"DROP TABLE {table}_default")
    op.execute("SET LOCAL lock_timeout = DEFAULT")


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"CREATE TABLE IF NOT EXISTS {table}_default PARTITION OF {table} DEFAULT")
