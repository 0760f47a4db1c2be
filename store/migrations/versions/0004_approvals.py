"""Approvals and notifications: votes, the audit trail, webhook events and their deliveries.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "relayq_decisions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("agent", sa.String(), nullable=False),
        sa.Column("tool", sa.String(), nullable=True),
        sa.Column("call_ids", sa.JSON(), nullable=True),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("role", sa.String(), nullable=True),
        sa.Column("groups", sa.JSON(), nullable=True),
        sa.Column("via", sa.String(), nullable=False),
        sa.Column("os_user", sa.String(), nullable=True),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("reason", sa.String(), nullable=True),
        sa.Column("arguments_hash", sa.String(), nullable=True),
        sa.Column("diff", sa.JSON(), nullable=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("relayq_decisions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_relayq_decisions_actor"), ["actor"], unique=False)
        batch_op.create_index(batch_op.f("ix_relayq_decisions_agent"), ["agent"], unique=False)
        batch_op.create_index(batch_op.f("ix_relayq_decisions_at"), ["at"], unique=False)
        batch_op.create_index(batch_op.f("ix_relayq_decisions_outcome"), ["outcome"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_relayq_decisions_request_id"), ["request_id"], unique=False
        )

    op.create_table(
        "relayq_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.String(), nullable=False),
        sa.Column("endpoint", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.String(), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("relayq_deliveries", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_relayq_deliveries_event_id"), ["event_id"], unique=False
        )
        batch_op.create_index("ix_relayq_deliveries_state_next", ["state", "next_at"], unique=False)
        batch_op.create_index(
            "ix_relayq_deliveries_event_endpoint", ["event_id", "endpoint"], unique=True
        )
        batch_op.create_index("ix_relayq_deliveries_endpoint_id", ["endpoint", "id"], unique=False)

    op.create_table(
        "relayq_delivery_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        sa.Column("event_id", sa.String(), nullable=False),
        sa.Column("endpoint", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("error", sa.String(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("relayq_delivery_attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_relayq_delivery_attempts_at"), ["at"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_relayq_delivery_attempts_delivery_id"), ["delivery_id"], unique=False
        )

    op.create_table(
        "relayq_events",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("type", sa.String(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=True),
        sa.Column("request_id", sa.String(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("relayq_events", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_relayq_events_created_at"), ["created_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_relayq_events_run_id"), ["run_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_relayq_events_type"), ["type"], unique=False)

    op.create_table(
        "relayq_votes",
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("voter", sa.String(), nullable=False),
        sa.Column("decision", sa.String(), nullable=False),
        sa.Column("arguments", sa.JSON(), nullable=True),
        sa.Column("reason", sa.String(), nullable=True),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("request_id", "voter"),
    )
    with op.batch_alter_table("relayq_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tool", sa.String(), nullable=True))
        batch_op.add_column(sa.Column("approvers", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("quorum", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("declines", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(
            sa.Column("forbid_self", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch_op.add_column(sa.Column("remind_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("reminded_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("escalation", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("step", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("overdue_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("outcome", sa.String(), nullable=True))
        batch_op.create_index(batch_op.f("ix_relayq_requests_outcome"), ["outcome"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_relayq_requests_remind_at"), ["remind_at"], unique=False
        )
        batch_op.create_index(batch_op.f("ix_relayq_requests_tool"), ["tool"], unique=False)

    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("started_by", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("relayq_runs", schema=None) as batch_op:
        batch_op.drop_column("started_by")

    with op.batch_alter_table("relayq_requests", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_requests_tool"))
        batch_op.drop_index(batch_op.f("ix_relayq_requests_remind_at"))
        batch_op.drop_index(batch_op.f("ix_relayq_requests_outcome"))
        batch_op.drop_column("outcome")
        batch_op.drop_column("overdue_at")
        batch_op.drop_column("step")
        batch_op.drop_column("escalation")
        batch_op.drop_column("reminded_at")
        batch_op.drop_column("remind_at")
        batch_op.drop_column("forbid_self")
        batch_op.drop_column("declines")
        batch_op.drop_column("quorum")
        batch_op.drop_column("approvers")
        batch_op.drop_column("tool")

    op.drop_table("relayq_votes")
    with op.batch_alter_table("relayq_events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_events_type"))
        batch_op.drop_index(batch_op.f("ix_relayq_events_run_id"))
        batch_op.drop_index(batch_op.f("ix_relayq_events_created_at"))

    op.drop_table("relayq_events")
    with op.batch_alter_table("relayq_delivery_attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_delivery_attempts_delivery_id"))
        batch_op.drop_index(batch_op.f("ix_relayq_delivery_attempts_at"))

    op.drop_table("relayq_delivery_attempts")
    with op.batch_alter_table("relayq_deliveries", schema=None) as batch_op:
        batch_op.drop_index("ix_relayq_deliveries_endpoint_id")
        batch_op.drop_index("ix_relayq_deliveries_event_endpoint")
        batch_op.drop_index("ix_relayq_deliveries_state_next")
        batch_op.drop_index(batch_op.f("ix_relayq_deliveries_event_id"))

    op.drop_table("relayq_deliveries")
    with op.batch_alter_table("relayq_decisions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_relayq_decisions_request_id"))
        batch_op.drop_index(batch_op.f("ix_relayq_decisions_outcome"))
        batch_op.drop_index(batch_op.f("ix_relayq_decisions_at"))
        batch_op.drop_index(batch_op.f("ix_relayq_decisions_agent"))
        batch_op.drop_index(batch_op.f("ix_relayq_decisions_actor"))

    op.drop_table("relayq_decisions")
