"""An index of each endpoint's pending webhook deliveries, by event (a replay's bound and dedupe)

A replay queued a new delivery of every event it named, whether or not one was already pending for
the endpoint, and nothing bounded how many it had pending: four loops replaying 400 events added
476,400 rows (151 MB) in 10 s (2026-11-28, a helper's probe). ``api/webhook_replay.py`` now skips
an event already pending for the endpoint and stops at ``MAX_REPLAY`` pending replays per
endpoint; both read this index, which holds only pending rows.

Built without stopping the deliveries' writes (the worker's record and engagement reports enqueue
in their own transactions): ``schema/migrations/partition_index.py``.
"""

from alembic import op

from schema.migrations.partition_index import create_concurrently

revision: str = "0013"
down_revision: str | None = "0012"

NAME = "ix_webhook_deliveries_pending_endpoint"


def upgrade() -> None:
    create_concurrently(
        parent="webhook_deliveries",
        name=NAME,
        columns="(endpoint_id, event_id) WHERE state = 'pending'",
        suffix="_pending_endpoint",
    )


def downgrade() -> None:
    op.execute(f"DROP INDEX {NAME}")
