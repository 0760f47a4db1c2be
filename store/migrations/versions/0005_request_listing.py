"""The inbox's listing in index order: open requests, oldest first, without a sort.

Revision ID: 0005
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_relayq_requests_status_created", "relayq_requests", ["status", "created_at", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_relayq_requests_status_created", table_name="relayq_requests")
