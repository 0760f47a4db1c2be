"""Fewer index writes per turn: runs' status in one index with its agent (not two), and
no index on when an outbox message was sent (the outbox holds only messages in flight).
Its rows are deleted once spent, so on SQLite its ids come from AUTOINCREMENT: an id
names a task message, and must never name another.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_relayq_runs_agent_status", table_name="relayq_runs")
    op.drop_index("ix_relayq_runs_status", table_name="relayq_runs")
    op.create_index("ix_relayq_runs_status_agent", "relayq_runs", ["status", "agent"])
    if op.get_bind().dialect.name != "sqlite":
        # PostgreSQL's sequence never hands out an id twice.
        op.drop_index("ix_relayq_outbox_published_at", table_name="relayq_outbox")
        return
    # SQLite: the table rebuilt with AUTOINCREMENT.
    with op.batch_alter_table(
        "relayq_outbox", recreate="always", table_kwargs={"sqlite_autoincrement": True}
    ) as batch:
        batch.drop_index("ix_relayq_outbox_published_at")


def downgrade() -> None:
    op.create_index("ix_relayq_outbox_published_at", "relayq_outbox", ["published_at"])
    op.drop_index("ix_relayq_runs_status_agent", table_name="relayq_runs")
    op.create_index("ix_relayq_runs_status", "relayq_runs", ["status"])
    op.create_index("ix_relayq_runs_agent_status", "relayq_runs", ["agent", "status"])
