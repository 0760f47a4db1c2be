"""The audit trail of calls decided by their policy without asking: a row without a
request (`request_id` nullable), what decided (`through`: person, system, policy,
grant:<id>), and the call's key, one row per call (`call_key`, unique).

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("relayq_decisions", schema=None) as batch_op:
        batch_op.alter_column("request_id", existing_type=sa.String(), nullable=True)
        batch_op.add_column(
            sa.Column("through", sa.String(), nullable=False, server_default="person")
        )
        batch_op.add_column(sa.Column("call_key", sa.String(), nullable=True))
        batch_op.create_index(batch_op.f("ix_relayq_decisions_call_key"), ["call_key"], unique=True)
    # The deadlines' rows were the system's.
    op.execute("UPDATE relayq_decisions SET through = 'system' WHERE via = 'system'")


def downgrade() -> None:
    op.execute("DELETE FROM relayq_decisions WHERE request_id IS NULL")
    with op.batch_alter_table("relayq_decisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_decisions_call_key"))
        batch_op.drop_column("call_key")
        batch_op.drop_column("through")
        batch_op.alter_column("request_id", existing_type=sa.String(), nullable=False)
