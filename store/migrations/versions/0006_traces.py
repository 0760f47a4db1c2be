"""Traces and metrics: a run keeps the context of its trace (a W3C `traceparent`), and runs
are counted by agent and status from an index.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("trace_context", sa.String(), nullable=True))
    op.create_index("ix_relayq_runs_agent_status", "relayq_runs", ["agent", "status"])


def downgrade() -> None:
    op.drop_index("ix_relayq_runs_agent_status", table_name="relayq_runs")
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.drop_column("trace_context")
