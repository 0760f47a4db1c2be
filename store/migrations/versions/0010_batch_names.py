"""A batch's name (by default its jobs file's): `relayq batch` finds a batch by it, so a
second start under another output file finds the batch that ran, not a new one.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("relayq_batches") as batch:
        batch.add_column(sa.Column("name", sa.String(), nullable=True))
    op.create_index("ix_relayq_batches_agent_name", "relayq_batches", ["agent", "name"])


def downgrade() -> None:
    op.drop_index("ix_relayq_batches_agent_name", table_name="relayq_batches")
    with op.batch_alter_table("relayq_batches") as batch:
        batch.drop_column("name")
