"""Durable state: runs, messages (one row each), requests, the tool-call ledger, the outbox.

SQLite (WAL) at `.relayq/relayq.db` by default; PostgreSQL via `RELAYQ_DATABASE_URL`.
Everything here is plain functions over a `Database`; nothing imports Celery.
"""

from store.answers import Accepted, accept_answer, accept_many, apply_answer_of, expire_requests
from store.audit import AuditQuery, Decider, decisions_of, list_decisions
from store.batches import (
    BatchCancel,
    BatchStatus,
    JobChanged,
    Started,
    UnknownBatch,
    batch_prompts,
    batch_results,
    batch_status,
    cancel_batch,
    find_batch,
    list_batches,
    result_of,
    start_batch,
)
from store.db import Database, default_database_url
from store.errors import JobExists, StaleClaim, StoreBusy, StoreUnavailable, UnknownRun
from store.ledger import ledger_get, ledger_put, ledger_start
from store.maintenance import Recovery, SweepReport, sweep
from store.migrate import migrate
from store.models import (
    FINISHED,
    BatchRow,
    LedgerRow,
    MessageRow,
    OutboxRow,
    RequestRow,
    RunRow,
    WorkerRow,
)
from store.paging import BadQuery, Page
from store.queries import (
    RunQuery,
    RunView,
    get_run,
    list_runs,
    run_result,
    run_view,
    settled,
    settled_many,
    transcript,
)
from store.requests import (
    CallHold,
    RequestPage,
    RequestQuery,
    StoredRequest,
    all_requests,
    get_request,
    get_requests,
    list_requests,
    query_requests,
    request_of,
)
from store.runs import CancelAsked, RunSpec, cancel_run, create_run, create_runs
from store.turns import (
    Charge,
    Claim,
    cancel_requested,
    claim_turn,
    fail_run,
    finish_cancelled,
    finish_turn,
    requeue_turn,
    retry_turn,
    save_reply,
)
from store.votes import proposed_arguments, votes_of
from store.workers import beat, forget_worker

__all__ = [
    # connecting
    "Database",
    "default_database_url",
    "migrate",
    # tables
    "FINISHED",
    "BatchRow",
    "LedgerRow",
    "MessageRow",
    "OutboxRow",
    "RequestRow",
    "RunRow",
    "WorkerRow",
    # runs and turns
    "RunSpec",
    "CancelAsked",
    "Charge",
    "Claim",
    "cancel_requested",
    "claim_turn",
    "create_run",
    "create_runs",
    "fail_run",
    "finish_cancelled",
    "finish_turn",
    "get_run",
    "ledger_get",
    "list_runs",
    "RunQuery",
    "ledger_put",
    "ledger_start",
    "request_of",
    "requeue_turn",
    "retry_turn",
    "run_result",
    "save_reply",
    "settled",
    "settled_many",
    "transcript",
    "RunView",
    "run_view",
    # answers
    "Accepted",
    "StoredRequest",
    "CallHold",
    "accept_answer",
    "accept_many",
    "apply_answer_of",
    "cancel_run",
    "expire_requests",
    "get_request",
    "get_requests",
    "list_requests",
    # listing requests: filters, sorts, pages
    "BadQuery",
    "Page",
    "RequestPage",
    "RequestQuery",
    "all_requests",
    "query_requests",
    # approvals and the audit trail
    "AuditQuery",
    "Decider",
    "decisions_of",
    "list_decisions",
    "proposed_arguments",
    "votes_of",
    # batches
    "BatchCancel",
    "BatchStatus",
    "JobChanged",
    "JobExists",
    "Started",
    "UnknownBatch",
    "batch_prompts",
    "batch_results",
    "batch_status",
    "cancel_batch",
    "find_batch",
    "list_batches",
    "result_of",
    "start_batch",
    # maintenance
    "Recovery",
    "SweepReport",
    "sweep",
    # workers
    "beat",
    "forget_worker",
    # errors
    "StaleClaim",
    "StoreBusy",
    "StoreUnavailable",
    "UnknownRun",
]
