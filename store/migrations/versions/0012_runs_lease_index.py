"""No index on a run's `lease_until`: no query looks runs up by it (the sweeper reads the
running runs by status and judges their leases one by one), and every claim and every
turn's end assign it, so the index was rewritten twice a turn for nothing.

Revision ID: 0012
Revises: 0011
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_relayq_runs_lease_until", table_name="relayq_runs")


def downgrade() -> None:
    op.create_index("ix_relayq_runs_lease_until", "relayq_runs", ["lease_until"])
