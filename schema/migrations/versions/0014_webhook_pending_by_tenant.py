"""An index of each tenant's pending webhook deliveries, by due time (the claim's walk past a
tenant at its share)

With one tenant at its share of the sender's calls, the claim read past that tenant's whole due
backlog to reach the other tenants' deliveries: 12.5-21.9 ms a claim with the tenant 100,000
deep, growing with the backlog (``python -m bench.contention``, 2026-11-28).
``workers/webhook_claim.py`` now walks the tenants with pending deliveries on this index, one
probe each, and takes the others' oldest due deliveries from it. Built as 0013's, without holding
the deliveries' partitions against writes (``schema/migrations/partition_index.py``).
"""

from alembic import op

from schema.migrations.partition_index import create_concurrently

revision: str = "0014"
down_revision: str | None = "0013"

NAME = "ix_webhook_deliveries_pending_tenant"


def upgrade() -> None:
    create_concurrently(
        parent="webhook_deliveries",
        name=NAME,
        columns="(tenant_id, next_attempt_at) WHERE state = 'pending'",
        suffix="_pending_tenant",
    )


def downgrade() -> None:
    op.execute(f"DROP INDEX {NAME}")
