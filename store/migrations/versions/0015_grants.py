"""Standing grants: approvals given once for calls to come (`store.grants`).

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "relayq_grants",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("tool", sa.String(), nullable=False),
        sa.Column("agent", sa.String(), nullable=True),
        sa.Column("scope", sa.String(), nullable=False),
        sa.Column("scope_id", sa.String(), nullable=True),
        sa.Column("match", sa.JSON(), nullable=True),
        sa.Column("max_uses", sa.Integer(), nullable=True),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("maker_groups", sa.JSON(), nullable=True),
        sa.Column("made_by", sa.String(), nullable=False),
        sa.Column("made_role", sa.String(), nullable=True),
        sa.Column("made_via", sa.String(), nullable=False),
        sa.Column("reason", sa.String(), nullable=True),
        sa.Column("from_request", sa.String(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_by", sa.String(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("relayq_grants", schema=None) as batch_op:
        batch_op.create_index("ix_relayq_grants_lookup", ["tool", "scope", "scope_id"])
        batch_op.create_index(batch_op.f("ix_relayq_grants_made_by"), ["made_by"])
        batch_op.create_index(batch_op.f("ix_relayq_grants_from_request"), ["from_request"])
        batch_op.create_index(batch_op.f("ix_relayq_grants_created_at"), ["created_at"])


def downgrade() -> None:
    op.drop_table("relayq_grants")
