"""Relay calls hosts lease: a row per call of an open relay request, and every lease.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "relayq_relay_calls",
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("answered", sa.Boolean(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("lease_id", sa.String(), nullable=True),
        sa.Column("holder", sa.String(), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("request_id", "call_id"),
    )
    op.create_index("ix_relayq_relay_calls_run_id", "relayq_relay_calls", ["run_id"])
    op.create_index(
        "ix_relayq_relay_calls_offer", "relayq_relay_calls", ["name", "answered", "created_at"]
    )
    op.create_table(
        "relayq_leases",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("request_id", sa.String(), nullable=False),
        sa.Column("call_id", sa.String(), nullable=False),
        sa.Column("holder", sa.String(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seconds", sa.Float(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_relayq_leases_request_id", "relayq_leases", ["request_id"])
    _offer_open_calls()


def _offer_open_calls() -> None:
    """The calls of relay requests open before this revision, less those with a result."""
    requests = sa.table(
        "relayq_requests",
        sa.column("id", sa.String()),
        sa.column("run_id", sa.String()),
        sa.column("kind", sa.String()),
        sa.column("status", sa.String()),
        sa.column("calls", sa.JSON()),
        sa.column("answer", sa.JSON()),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    calls = sa.table(
        "relayq_relay_calls",
        sa.column("request_id", sa.String()),
        sa.column("call_id", sa.String()),
        sa.column("run_id", sa.String()),
        sa.column("name", sa.String()),
        sa.column("answered", sa.Boolean()),
        sa.column("attempt", sa.Integer()),
        sa.column("created_at", sa.DateTime(timezone=True)),
    )
    bind = op.get_bind()
    query = sa.select(requests).where(requests.c.status == "open", requests.c.kind == "tool_call")
    rows = []
    for request in bind.execute(query):
        answer = request.answer or {}
        results = ((answer.get("data") or {}).get("results")) or []
        done = {r.get("id") for r in results if isinstance(r, dict)}
        for call in request.calls or []:
            rows.append(
                {
                    "request_id": request.id,
                    "call_id": call["id"],
                    "run_id": request.run_id,
                    "name": call["name"],
                    "answered": call["id"] in done,
                    "attempt": 0,
                    "created_at": request.created_at,
                }
            )
    for at in range(0, len(rows), 500):
        bind.execute(calls.insert(), rows[at : at + 500])


def downgrade() -> None:
    op.drop_index("ix_relayq_leases_request_id", table_name="relayq_leases")
    op.drop_table("relayq_leases")
    op.drop_index("ix_relayq_relay_calls_offer", table_name="relayq_relay_calls")
    op.drop_index("ix_relayq_relay_calls_run_id", table_name="relayq_relay_calls")
    op.drop_table("relayq_relay_calls")
