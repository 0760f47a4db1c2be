"""The inbox and batches: open requests listed in index order; batches as records, their
runs knowing their batch and job, one current run per job.

Revision ID: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_CURRENT = sa.text("replaced_by IS NULL")


def upgrade() -> None:
    op.create_index(
        "ix_relayq_requests_status_created", "relayq_requests", ["status", "created_at", "id"]
    )
    op.create_table(
        "relayq_batches",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("agent", sa.String(), nullable=False),
        sa.Column("started_by", sa.String(), nullable=True),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("options", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("relayq_batches", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_relayq_batches_agent"), ["agent"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_relayq_batches_created_at"), ["created_at"], unique=False
        )
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("batch_id", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("job_id", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("job_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("replaced_by", sa.String(), nullable=True))
        batch_op.create_index(batch_op.f("ix_relayq_runs_batch_id"), ["batch_id"], unique=False)
    op.create_index(
        "ux_relayq_runs_batch_job",
        "relayq_runs",
        ["batch_id", "job_id"],
        unique=True,
        sqlite_where=_CURRENT,
        postgresql_where=_CURRENT,
    )


def downgrade() -> None:
    op.drop_index("ux_relayq_runs_batch_job", table_name="relayq_runs")
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_runs_batch_id"))
        batch_op.drop_column("replaced_by")
        batch_op.drop_column("job_index")
        batch_op.drop_column("job_id")
        batch_op.drop_column("batch_id")
    with op.batch_alter_table("relayq_batches", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_batches_created_at"))
        batch_op.drop_index(batch_op.f("ix_relayq_batches_agent"))
    op.drop_table("relayq_batches")
    op.drop_index("ix_relayq_requests_status_created", table_name="relayq_requests")
