"""One index on a partitioned table, built without holding its partitions against writes.

``CREATE INDEX`` on a partitioned parent holds every partition against writes for the whole build.
Instead the parent's index is made ``ON ONLY`` (empty, invalid), each partition's
``CONCURRENTLY`` outside a transaction, then attached; the parent's becomes valid with the last.
Partitions created later get theirs when attached (PostgreSQL builds it). Safe to run again after
a failure half-way (the block commits as it goes): what exists is kept, a build a failure left
invalid is made again, and a partition dropped meanwhile is skipped.

Migrations import this module, so it changes only in ways that build the same indexes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

_PARTITIONS = """
SELECT c.relname,
       (SELECT x.indisvalid FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
         WHERE x.indrelid = c.oid AND i.relname = c.relname || :suffix) AS valid,
       EXISTS (SELECT 1 FROM pg_inherits a JOIN pg_class i ON i.oid = a.inhrelid
                WHERE i.relname = c.relname || :suffix) AS attached
  FROM pg_inherits h JOIN pg_class c ON c.oid = h.inhrelid
 WHERE h.inhparent = CAST(:parent AS regclass) ORDER BY c.relname
"""


def create_concurrently(*, parent: str, name: str, columns: str, suffix: str) -> None:
    """``CREATE INDEX name ON parent columns``, each partition's named ``<partition><suffix>``."""
    op.execute(f"CREATE INDEX IF NOT EXISTS {name} ON ONLY {parent} {columns}")
    rows = op.get_bind().execute(sa.text(_PARTITIONS), {"parent": parent, "suffix": suffix}).all()
    with op.get_context().autocommit_block():
        for partition, valid, attached in rows:
            index = f"{partition}{suffix}"
            if valid is False:
                op.execute(f'DROP INDEX CONCURRENTLY IF EXISTS "{index}"')
            op.execute(f'CREATE INDEX CONCURRENTLY IF NOT EXISTS "{index}" ON "{partition}" {columns}')
            if not attached:
                op.execute(f'ALTER INDEX {name} ATTACH PARTITION "{index}"')
