"""Recovery: worker heartbeats behind claims, tool executions counted, unapplied answers found fast.

Revision ID: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "relayq_workers",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("hostname", sa.String(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("relayq_workers", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_relayq_workers_heartbeat_at"), ["heartbeat_at"], unique=False
        )
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("worker", sa.String(), nullable=True))
    with op.batch_alter_table("relayq_ledger", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("executions", sa.Integer(), nullable=False, server_default="0")
        )
    with op.batch_alter_table("relayq_requests", schema=None) as batch_op:
        batch_op.create_index(
            "ix_relayq_requests_applied_status", ["applied", "status"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("relayq_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_relayq_requests_applied_status")
    with op.batch_alter_table("relayq_ledger", schema=None) as batch_op:
        batch_op.drop_column("executions")
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.drop_column("worker")
    with op.batch_alter_table("relayq_workers", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_workers_heartbeat_at"))
    op.drop_table("relayq_workers")
