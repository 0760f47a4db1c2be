"""Worker deaths counted apart from failed model calls, each against its own limit.

Revision ID: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("crashes", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.drop_column("crashes")
