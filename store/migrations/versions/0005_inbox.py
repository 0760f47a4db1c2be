"""The inbox: open requests listed in index order; runs know their batch and job.

Revision ID: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_relayq_requests_status_created", "relayq_requests", ["status", "created_at", "id"]
    )
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("batch_id", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("job_id", sa.String(), nullable=True))
        batch_op.create_index(batch_op.f("ix_relayq_runs_batch_id"), ["batch_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_runs_batch_id"))
        batch_op.drop_column("job_id")
        batch_op.drop_column("batch_id")
    op.drop_index("ix_relayq_requests_status_created", table_name="relayq_requests")
