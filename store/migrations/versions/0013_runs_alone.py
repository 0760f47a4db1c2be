"""A crash counted against the turn that caused it: whether a run's claim runs alone in
its process (`held_alone`), and whether its last holder died holding it beside other
turns (`suspect`: its next turns run alone until one ends).

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("suspect", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("held_alone", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.drop_column("held_alone")
        batch_op.drop_column("suspect")
