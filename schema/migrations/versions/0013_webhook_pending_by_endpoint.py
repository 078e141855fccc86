"""An index of each endpoint's pending webhook deliveries, by event (a replay's bound and dedupe)

A replay queued a new delivery of every event it named, whether or not one was already pending for
the endpoint, and nothing bounded how many it had pending: four loops replaying 400 events added
476,400 rows (151 MB) in 10 s (2026-11-28, a helper's probe). ``api/webhook_replay.py`` now skips
an event already pending for the endpoint and stops at ``MAX_REPLAY`` pending replays per
endpoint; both read this index, which holds only pending rows.

Built without stopping the deliveries' writes (the worker's record and engagement reports enqueue
in their own transactions): ``CREATE INDEX`` on the partitioned parent would hold every day's
partition against writes for the whole build. The parent's index is made ``ON ONLY`` (empty,
invalid), each partition's ``CONCURRENTLY`` outside a transaction, then attached; the parent's
becomes valid with the last. Days created later get theirs when attached (PostgreSQL builds it).
"""

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"

NAME = "ix_webhook_deliveries_pending_endpoint"
COLUMNS = "(endpoint_id, event_id) WHERE state = 'pending'"


# Safe to run again after a failure half-way (the block commits as it goes): what exists is kept,
# a build a failure left invalid is made again, and a day dropped meanwhile is skipped.
_DAYS = """
SELECT c.relname,
       (SELECT x.indisvalid FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
         WHERE x.indrelid = c.oid AND i.relname = c.relname || '_pending_endpoint') AS valid,
       EXISTS (SELECT 1 FROM pg_inherits a JOIN pg_class i ON i.oid = a.inhrelid
                WHERE i.relname = c.relname || '_pending_endpoint') AS attached
  FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
 WHERE h.inhparent = 'webhook_deliveries'::regclass ORDER BY c.relname
"""


def upgrade() -> None:
    op.execute(f"CREATE INDEX IF NOT EXISTS {NAME} ON ONLY webhook_deliveries {COLUMNS}")
    days = op.get_bind().execute(sa.text(_DAYS)).all()
    with op.get_context().autocommit_block():
        for name, valid, attached in days:
            index = f"{name}_pending_endpoint"
            if valid is False:
                op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{index}"')
            op.execute(f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{index}" ON "{name}" {COLUMNS}')
            if not attached:
                op.execute(f'ALTER INDEX {NAME} ATTACH PARTITION "{index}"')


def downgrade() -> None:
    op.execute(f"DROP INDEX {NAME}")
