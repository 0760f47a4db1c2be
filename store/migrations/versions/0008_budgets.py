"""Budgets: a run's and a batch's budget, what a run's calls cost, what a batch has spent.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cost", sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("budget", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("waiting_on", sa.String(), nullable=True))
        batch_op.create_index("ix_relayq_runs_waiting_on", ["waiting_on"])
    with op.batch_alter_table("relayq_batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("budget", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("spent_tokens", sa.Integer(), nullable=False, server_default="0")
        )
        batch_op.add_column(sa.Column("spent_cost", sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(
            sa.Column("over_budget", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("relayq_batches", schema=None) as batch_op:
        for column in ("over_budget", "spent_cost", "spent_tokens", "budget"):
            batch_op.drop_column(column)
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.drop_index("ix_relayq_runs_waiting_on")
        batch_op.drop_column("waiting_on")
        batch_op.drop_column("budget")
        batch_op.drop_column("cost")
