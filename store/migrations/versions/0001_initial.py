"""The initial schema: runs, messages (one row each), requests, the ledger, the outbox.

Revision ID: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "relayq_ledger",
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("at", sa.Integer(), nullable=False),
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("attempt", sa.String(), nullable=False),
        sa.Column("outcome", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "at", "call_id", "attempt"),
    )
    op.create_table(
        "relayq_messages",
        sa.Column("conversation_id", sa.String(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("role", sa.String(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("conversation_id", "seq"),
    )
    with op.batch_alter_table("relayq_messages", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_relayq_messages_run_id"), ["run_id"], unique=False)

    op.create_table(
        "relayq_outbox",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task", sa.String(), nullable=False),
        sa.Column("queue", sa.String(), nullable=False),
        sa.Column("args", sa.JSON(), nullable=True),
        sa.Column("countdown", sa.Float(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("label", sa.String(), nullable=False),
        sa.Column("sends", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("relayq_outbox", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_relayq_outbox_published_at"), ["published_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_relayq_outbox_run_id"), ["run_id"], unique=False)

    op.create_table(
        "relayq_requests",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("agent", sa.String(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("prompt", sa.String(), nullable=False),
        sa.Column("url", sa.String(), nullable=True),
        sa.Column("data", sa.JSON(), nullable=True),
        sa.Column("calls", sa.JSON(), nullable=True),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("on_expiry", sa.String(), nullable=False),
        sa.Column("answer", sa.JSON(), nullable=True),
        sa.Column("answered_by", sa.String(), nullable=True),
        sa.Column("answered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("applied", sa.Boolean(), nullable=False),
        sa.Column("revision", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("relayq_requests", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_relayq_requests_agent"), ["agent"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_relayq_requests_created_at"), ["created_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_relayq_requests_kind"), ["kind"], unique=False)
        batch_op.create_index(batch_op.f("ix_relayq_requests_run_id"), ["run_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_relayq_requests_status"), ["status"], unique=False)
        batch_op.create_index(
            "ix_relayq_requests_status_expires", ["status", "expires_at"], unique=False
        )

    op.create_table(
        "relayq_runs",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("agent", sa.String(), nullable=False),
        sa.Column("conversation_id", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("start_seq", sa.Integer(), nullable=False),
        sa.Column("tools_digest", sa.String(), nullable=True),
        sa.Column("text", sa.String(), nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("claimed_by", sa.String(), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("turns", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("total_tokens", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_relayq_runs_agent"), ["agent"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_relayq_runs_conversation_id"), ["conversation_id"], unique=False
        )
        batch_op.create_index(
            batch_op.f("ix_relayq_runs_lease_until"), ["lease_until"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_relayq_runs_status"), ["status"], unique=False)
        batch_op.create_index(batch_op.f("ix_relayq_runs_updated_at"), ["updated_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_runs_updated_at"))
        batch_op.drop_index(batch_op.f("ix_relayq_runs_status"))
        batch_op.drop_index(batch_op.f("ix_relayq_runs_lease_until"))
        batch_op.drop_index(batch_op.f("ix_relayq_runs_conversation_id"))
        batch_op.drop_index(batch_op.f("ix_relayq_runs_agent"))

    op.drop_table("relayq_runs")
    with op.batch_alter_table("relayq_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_relayq_requests_status_expires")
        batch_op.drop_index(batch_op.f("ix_relayq_requests_status"))
        batch_op.drop_index(batch_op.f("ix_relayq_requests_run_id"))
        batch_op.drop_index(batch_op.f("ix_relayq_requests_kind"))
        batch_op.drop_index(batch_op.f("ix_relayq_requests_created_at"))
        batch_op.drop_index(batch_op.f("ix_relayq_requests_agent"))

    op.drop_table("relayq_requests")
    with op.batch_alter_table("relayq_outbox", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_outbox_run_id"))
        batch_op.drop_index(batch_op.f("ix_relayq_outbox_published_at"))

    op.drop_table("relayq_outbox")
    with op.batch_alter_table("relayq_messages", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_messages_run_id"))

    op.drop_table("relayq_messages")
    op.drop_table("relayq_ledger")
