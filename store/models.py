"""The tables. One row per message: a transcript grows by one row a message, never by copies."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, DateTime, Index, TypeDecorator, text
from sqlmodel import Field, SQLModel

__all__ = [
    "DecisionRow",
    "DeliveryAttemptRow",
    "DeliveryRow",
    "EventRow",
    "LeaseRow",
    "LedgerRow",
    "MessageRow",
    "OutboxRow",
    "RelayCallRow",
    "RequestRow",
    "RunRow",
    "RunState",
    "VoteRow",
    "WorkerRow",
    "utcnow",
]

# Every state a durable run can be in.
RunState = str  # queued | running | pending | done | failed | cancelled | incomplete | over_budget
FINISHED = ("done", "failed", "cancelled", "incomplete", "over_budget")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, whether the database keeps time zones or not."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use an aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _time(*, index: bool = False, nullable: bool = True) -> Any:
    return Field(default=None, sa_column=Column(UTCDateTime(), index=index, nullable=nullable))


def _json() -> Any:
    return Field(default=None, sa_column=Column(JSON, nullable=True))


class RunRow(SQLModel, table=True):
    __tablename__ = "relayq_runs"
    __table_args__ = (
        # A batch's job has one current run: a rerun, or a crash between starting and
        # recording, can never start it twice.
        Index(
            "ux_relayq_runs_batch_job",
            "batch_id",
            "job_id",
            unique=True,
            sqlite_where=text("replaced_by IS NULL"),
            postgresql_where=text("replaced_by IS NULL"),
        ),
        # Runs by status (the sweeper's, the lists'), and the metrics' runs by status and
        # agent counted from the index alone. One index, not two: every turn moves its
        # run's status twice, and each index on it is a page rewritten (migration 0009).
        Index("ix_relayq_runs_status_agent", "status", "agent"),
    )

    id: str = Field(primary_key=True)
    agent: str = Field(index=True)
    conversation_id: str = Field(index=True)
    status: str
    version: int = 0
    """Bumped by every state change; a turn message carries the version it may claim."""
    start_seq: int = 0
    """Where the run's prompt sits in its conversation."""
    tools_digest: str | None = None
    """A digest of the agent's tools when the run first ran, to notice them changing."""
    text: str | None = None
    error: str | None = None
    attempts: int = 0
    """Model-call failures in a row; a turn that succeeds resets it."""
    crashes: int = 0
    """Workers that died holding this turn alone (`held_alone`); a turn that finishes
    resets it."""
    suspect: bool = False
    """Its worker died holding it beside other turns: which of them killed it is not
    known, so its next turns run alone until one ends (`tasks.runner.alone`)."""
    started_by: str | None = None
    """The identity that started the run (an API token's name, `cli:<os user>`), if known."""
    batch_id: str | None = Field(default=None, index=True)
    """The batch the run is a job of, if any (`relayq batch`, or the host's own)."""
    job_id: str | None = None
    """The job's id within its batch, as the batch's input gave it."""
    job_index: int | None = None
    """Where the job sits in its batch's input, from 0: exports keep that order."""
    replaced_by: str | None = None
    """The run that took this job over when its batch was rerun with a changed prompt."""
    cancel_requested: bool = False
    claimed_by: str | None = None
    """The task id holding the current claim; a redelivery of that task may take it over."""
    worker: str | None = None
    """The worker process holding the claim: the claim lasts while its heartbeat does."""
    lease_until: datetime | None = _time()
    """For a claim no worker heartbeat stands behind: when it lapses. Not indexed: no query
    looks runs up by it (migration 0012)."""
    held_alone: bool | None = None
    """The claim's process runs no other turn meanwhile: its death is this turn's doing."""
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cost: float = 0.0
    """What the run's model calls cost, in the unit of the provider's prices (0: no price)."""
    budget: dict[str, Any] | None = _json()
    """The run's budget (`relayq.budgets.Budget` wire), raised when a person allows more."""
    waiting_on: str | None = Field(default=None, index=True)
    """The request of another run this pending run waits on: its batch's `budget` request."""
    trace_context: str | None = None
    """The run's trace (a W3C `traceparent`), when tracing is on: every span of the run
    (turns, suspensions, decisions, resumes) joins it (`tasks.observability.tracing`)."""
    created_at: datetime = _time(nullable=False)
    updated_at: datetime = _time(index=True, nullable=False)


class BatchRow(SQLModel, table=True):
    """A batch: many runs of one agent, one per job, started and followed together."""

    __tablename__ = "relayq_batches"
    __table_args__ = (Index("ix_relayq_batches_agent_name", "agent", "name"),)

    id: str = Field(primary_key=True)
    agent: str = Field(index=True)
    name: str | None = None
    """What `relayq batch` knows it by (its jobs file's name, or `--name`); not unique:
    `--new` starts another of the same name, and the newest is the one found."""
    started_by: str | None = None
    jobs: int = 0
    """Jobs in the batch (a rerun may add some)."""
    options: dict[str, Any] = _json()
    created_at: datetime = _time(index=True, nullable=False)
    cancelled_at: datetime | None = _time()
    queue: str | None = None
    """The queue every turn of the batch's runs goes to (`store.batch_queues`), named from
    its agent's queue when the batch started; None for a batch older than batch queues."""
    budget: dict[str, Any] | None = _json()
    """The most all the batch's runs together may spend (`relayq.budgets.Budget` wire)."""
    spent_tokens: int = 0
    spent_cost: float = 0.0
    """What the batch's runs have spent: kept only when the batch has a budget."""
    over_budget: bool = False
    """A person declined to raise the batch's budget: its runs end at their next call."""


class MessageRow(SQLModel, table=True):
    __tablename__ = "relayq_messages"

    conversation_id: str = Field(primary_key=True)
    seq: int = Field(primary_key=True)
    run_id: str = Field(index=True)
    role: str
    body: dict[str, Any] = _json()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    created_at: datetime = _time(nullable=False)


class RequestRow(SQLModel, table=True):
    __tablename__ = "relayq_requests"
    __table_args__ = (
        Index("ix_relayq_requests_status_expires", "status", "expires_at"),
        # The inbox's page: a status's requests in age order, read without sorting them all.
        Index("ix_relayq_requests_status_created", "status", "created_at", "id"),
        # The sweeper's look for accepted answers whose task never ran.
        Index("ix_relayq_requests_applied_status", "applied", "status"),
    )

    id: str = Field(primary_key=True)
    run_id: str = Field(index=True)
    agent: str = Field(index=True)
    kind: str = Field(index=True)
    prompt: str
    url: str | None = None
    data: dict[str, Any] = _json()
    """The request's data, less its relay calls."""
    calls: list[dict[str, Any]] = _json()
    """The relay calls the request carries (empty for other kinds)."""
    status: str = Field(default="open", index=True)
    """open | answered | expired | cancelled"""
    expires_at: datetime | None = _time()
    on_expiry: str = "error"
    """What expiry does: `error` gives the calls error results, `cancel` cancels the run."""
    answer: dict[str, Any] | None = _json()
    """The answer in wire form; partial answers accumulate their results here."""
    answered_by: str | None = None
    answered_at: datetime | None = _time()
    applied: bool = False
    """The answer has been written into the transcript and the run re-enqueued."""
    revision: int = 0
    created_at: datetime = _time(index=True, nullable=False)
    # Approvals and the inbox (see `relayq.approvals`, `store.votes`).
    tool: str | None = Field(default=None, index=True)
    """The tool the request is about: an approval's tool, a relay request's (first) call's."""
    approvers: list[str] | None = _json()
    """Groups whose members may decide it now (empty or None: anyone who may answer)."""
    quorum: int = 1
    """Distinct approvals that resolve it."""
    declines: int = 1
    """Distinct declines that resolve it declined."""
    forbid_self: bool = False
    """The identity that started the run may not decide it."""
    remind_at: datetime | None = _time(index=True)
    reminded_at: datetime | None = _time()
    escalation: list[dict[str, Any]] | None = _json()
    """Escalation steps still ahead: `[{approvers, expiresIn}]`."""
    step: int = 0
    """Escalation steps taken."""
    overdue_at: datetime | None = _time()
    """When a request that stays open past its deadline was noticed overdue."""
    outcome: str | None = Field(default=None, index=True)
    """How it was resolved: approved, edited, declined, answered, expired, cancelled."""


class VoteRow(SQLModel, table=True):
    """One person's decision on a request that needs a quorum; one each."""

    __tablename__ = "relayq_votes"

    request_id: str = Field(primary_key=True)
    voter: str = Field(primary_key=True)
    decision: str
    """approve | edit | decline"""
    arguments: dict[str, Any] | None = _json()
    """The arguments approved (the edited ones for an edit)."""
    reason: str | None = None
    step: int = 0
    at: datetime = _time(nullable=False)


class RelayCallRow(SQLModel, table=True):
    """A relay call of an open request, as hosts lease it (`store.leases`)."""

    __tablename__ = "relayq_relay_calls"
    __table_args__ = (
        # The offer: a tool's calls without a result, oldest first.
        Index("ix_relayq_relay_calls_offer", "name", "answered", "created_at"),
    )

    request_id: str = Field(primary_key=True)
    call_id: str = Field(primary_key=True)
    run_id: str = Field(index=True)
    name: str
    """The relay tool."""
    answered: bool = False
    """The call has its result (from a host or a person): never offered again."""
    attempt: int = 0
    """Leases of the call so far."""
    lease_id: str | None = None
    """Its live lease, if any (live until `lease_until`)."""
    holder: str | None = None
    """Who holds that lease: a host token's name."""
    lease_until: datetime | None = _time()
    created_at: datetime = _time(nullable=False)


class LeaseRow(SQLModel, table=True):
    """One lease of a relay call to a host, kept so a late caller learns why it lapsed."""

    __tablename__ = "relayq_leases"

    id: str = Field(primary_key=True)
    request_id: str = Field(index=True)
    call_id: str
    holder: str
    attempt: int
    seconds: float
    """The lease's length, which each heartbeat extends it by."""
    status: str = "held"
    """held | done | released (an expired or superseded lease stays `held`)"""
    expires_at: datetime = _time(nullable=False)
    created_at: datetime = _time(nullable=False)


class DecisionRow(SQLModel, table=True):
    """The audit trail: every decision, vote and expiry. Appended, never updated; removed
    only for RELAYQ_AUDIT_RETENTION (kept for good by default), never with its run."""

    __tablename__ = "relayq_decisions"

    id: int | None = Field(default=None, primary_key=True)
    request_id: str | None = Field(default=None, index=True)
    """The request decided; None for a call its policy decided without asking."""
    run_id: str
    agent: str = Field(index=True)
    tool: str | None = None
    call_ids: list[str] = _json()
    actor: str = Field(index=True)
    """Who: a token's name, `cli:<os user>`, `relayq:expiry` or `relayq:policy` for the
    system."""
    role: str | None = None
    groups: list[str] = _json()
    via: str
    """inbox | api | cli | python | system"""
    os_user: str | None = None
    """The operating-system user, for decisions made with the CLI."""
    outcome: str = Field(index=True)
    """approved | edited | declined | answered | voted | expired | escalated | overdue |
    denied | asked"""
    through: str = Field(default="person", sa_column_kwargs={"server_default": "person"})
    """What decided: `person`, `system` (a deadline), `policy` (the tool's policy, without
    asking), or `grant:<id>` (a standing grant)."""
    call_key: str | None = Field(default=None, unique=True, index=True)
    """The call's idempotency key, for a row its policy wrote: one per call, however often
    the call is run."""
    reason: str | None = None
    arguments_hash: str | None = None
    """SHA-256 of the arguments the decider saw."""
    diff: dict[str, Any] | None = _json()
    """An edit's changes: `{key: [before, after]}`."""
    at: datetime = _time(index=True, nullable=False)


class EventRow(SQLModel, table=True):
    """Something that happened, for the webhooks: written in the transaction that did it."""

    __tablename__ = "relayq_events"

    id: str = Field(primary_key=True)
    type: str = Field(index=True)
    """request.opened | request.reminder | request.escalated | request.decided |
    request.expired | run.finished | run.failed"""
    run_id: str | None = Field(default=None, index=True)
    request_id: str | None = None
    payload: dict[str, Any] = _json()
    created_at: datetime = _time(index=True, nullable=False)


class DeliveryRow(SQLModel, table=True):
    """One event to one webhook endpoint: retried with backoff until delivered."""

    __tablename__ = "relayq_deliveries"
    __table_args__ = (
        Index("ix_relayq_deliveries_state_next", "state", "next_at"),
        Index("ix_relayq_deliveries_event_endpoint", "event_id", "endpoint", unique=True),
        # Where fan-out resumes for an endpoint: its newest delivery.
        Index("ix_relayq_deliveries_endpoint_id", "endpoint", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    event_id: str = Field(index=True)
    endpoint: str
    state: str = "pending"
    """pending | delivered | failed (gave up)"""
    attempts: int = 0
    next_at: datetime = _time(nullable=False)
    last_status: int | None = None
    last_error: str | None = None
    delivered_at: datetime | None = _time()
    created_at: datetime = _time(nullable=False)


class DeliveryAttemptRow(SQLModel, table=True):
    """The delivery log: one row per attempt."""

    __tablename__ = "relayq_delivery_attempts"

    id: int | None = Field(default=None, primary_key=True)
    delivery_id: int = Field(index=True)
    event_id: str
    endpoint: str
    attempt: int
    status: int | None = None
    error: str | None = None
    duration_ms: float = 0.0
    at: datetime = _time(index=True, nullable=False)


class LedgerRow(SQLModel, table=True):
    """One finished tool call: a redelivered turn reads it instead of running the tool again."""

    __tablename__ = "relayq_ledger"

    run_id: str = Field(primary_key=True)
    at: int = Field(primary_key=True)
    """The transcript index of the assistant message that made the call."""
    call_id: str = Field(primary_key=True)
    attempt: str = Field(primary_key=True)
    """The id of the answer a tool was called again with, or "" for its first call."""
    outcome: dict[str, Any] | None = Field(
        default=None, sa_column=Column(JSON(none_as_null=True), nullable=True)
    )
    """SQL NULL while the call runs (or after its worker died running it)."""
    executions: int = 0
    """How many times the call was started: `ctx.attempt` of its latest start."""
    created_at: datetime = _time(nullable=False)


class OutboxRow(SQLModel, table=True):
    """A task message written in the transaction that decided it, sent after commit."""

    __tablename__ = "relayq_outbox"
    # Rows are deleted once spent, and an id names a task message (`relayq-<id>`): on
    # SQLite an id freed at the top would be handed out again without AUTOINCREMENT.
    __table_args__ = {"sqlite_autoincrement": True}

    id: int | None = Field(default=None, primary_key=True)
    task: str
    queue: str
    args: list[Any] = _json()
    countdown: float = 0.0
    run_id: str | None = Field(default=None, index=True)
    label: str = ""
    """What Flower shows as the task's arguments: ids and turn, never content."""
    sends: int = 0
    created_at: datetime = _time(nullable=False)
    published_at: datetime | None = _time()
    """When it was sent; None until then. Unindexed: the outbox holds only messages whose
    effect is still to come (`store.outbox.prune`), so the sweeper reads it whole."""


class WorkerRow(SQLModel, table=True):
    """A live worker process: its heartbeat is what keeps its claims."""

    __tablename__ = "relayq_workers"

    id: str = Field(primary_key=True)
    """`host:pid:random`, one per process that runs turns."""
    hostname: str
    pid: int
    started_at: datetime = _time(nullable=False)
    heartbeat_at: datetime = _time(index=True, nullable=False)


class GrantRow(SQLModel, table=True):
    """A standing grant: calls of a tool it covers are approved without asking a person
    (`relayq.grants`, `store.grants`). Never deleted: revoked or expired, it stays, as
    the audit trail's rows naming it do."""

    __tablename__ = "relayq_grants"
    __table_args__ = (Index("ix_relayq_grants_lookup", "tool", "scope", "scope_id"),)

    id: str = Field(primary_key=True)
    tool: str
    agent: str | None = None
    """None: every agent with the tool (scope `all`)."""
    scope: str
    """run | conversation | principal | agent | all"""
    scope_id: str | None = None
    """The run, conversation or principal covered; None for agent and all."""
    match: dict[str, Any] = _json()
    """`relayq.matching.Matcher` wire: `{"arguments": {...}}` or `{"where": [...]}`."""
    max_uses: int | None = None
    uses: int = 0
    maker_groups: list[str] | None = _json()
    """The approver groups its maker decided for; None: an administrator's, any group. A
    call whose policy names groups, none of them these, is not covered by it."""
    made_by: str = Field(index=True)
    made_role: str | None = None
    made_via: str
    reason: str | None = None
    from_request: str | None = Field(default=None, index=True)
    """The request whose decision made it, if one did."""
    created_at: datetime = _time(index=True, nullable=False)
    expires_at: datetime = _time(nullable=False)
    revoked_at: datetime | None = _time()
    revoked_by: str | None = None
