"""The statements every turn runs, built once: no ORM unit of work on the turn's path.

Parameters are bound by name: `:rid` the run, `:v` the version a claim holds,
`:now`, and the few each statement names. Builders that differ per SQL dialect
(the upserts) are cached per dialect name.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Boolean, and_, bindparam, func, not_, or_
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlmodel import select

from store.models import BatchRow, LedgerRow, MessageRow, RunRow
from store.transitions import transition

__all__ = [
    "BATCHES",
    "BATCH_BUDGET",
    "CANCEL_FLAG",
    "CHARGE_BATCH",
    "CLAIM",
    "CONVERSATION",
    "LEDGER",
    "LEDGER_OUTCOME",
    "MESSAGES",
    "RUNS",
    "REPLY_SAVED",
    "finish",
    "ledger_finish",
    "ledger_insert",
    "ledger_start",
    "upsert_message",
]


RUNS = RunRow.__table__  # type: ignore[attr-defined]


MESSAGES = MessageRow.__table__  # type: ignore[attr-defined]


LEDGER = LedgerRow.__table__  # type: ignore[attr-defined]


# The statements every turn runs, built once.
_CLAIMED = (
    "version", "agent", "conversation_id", "tools_digest", "attempts", "crashes", "turns",
    "total_tokens", "cost", "budget", "batch_id", "suspect", "held_alone", "started_by",
)  # fmt: skip


BATCHES = BatchRow.__table__  # type: ignore[attr-defined]


# The run's batch's budget, read with the claim: a batch run's turn need not read it apart.
BATCH_BUDGET = (
    select(BATCHES.c.budget)
    .where(BATCHES.c.id == RUNS.c.batch_id)
    .scalar_subquery()
    .label("batch_budget")
)


# The claimant's process runs the turn alone (its death is the turn's: `died_holding`) when
# it runs one turn at a time (`alone`, a prefork child), or when the run is suspect and the
# claimant cannot run it apart: a worker that can (`apart`) runs it in a child process of
# its own (`tasks.runner.alone`), and counts that child's death itself (`requeue_turn`).
HELD_ALONE = or_(
    bindparam("alone", type_=Boolean),
    and_(RUNS.c.suspect, not_(bindparam("apart", type_=Boolean))),
)


CLAIM = (
    transition(
        "queued", "running", sets=("claimed_by", "worker", "lease_until"), returning=_CLAIMED
    )
    .values(held_alone=HELD_ALONE)
    .where(RUNS.c.cancel_requested.is_(False))
    .returning(BATCH_BUDGET)
)


CONVERSATION = (
    select(MESSAGES.c.body)
    .where(MESSAGES.c.conversation_id == bindparam("conv"))
    .order_by(MESSAGES.c.seq)
)


# The claim `v` on run `rid` still stands: the check of every write a turn makes.
_HELD_BY = (
    RUNS.c.id == bindparam("rid"),
    RUNS.c.version == bindparam("v"),
    RUNS.c.status == "running",
)


# A model's reply kept: the claim check, and what the call spent added to the run's totals.
# `updated_at` stays: it is indexed, and the turn's finish stamps it a moment later.
REPLY_SAVED = (
    RUNS.update()
    .where(*_HELD_BY)
    .values(
        turns=RUNS.c.turns + 1,
        prompt_tokens=RUNS.c.prompt_tokens + bindparam("prompt"),
        completion_tokens=RUNS.c.completion_tokens + bindparam("completion"),
        total_tokens=RUNS.c.total_tokens + bindparam("total"),
        cost=RUNS.c.cost + bindparam("cost"),
    )
    .returning(RUNS.c.cancel_requested)
)


@functools.cache
def finish(to: str, *, charged: bool = False) -> Any:
    """The claim check and the run's new state after a turn, in one statement; `charged`:
    with the reply's spending too (`REPLY_SAVED`'s), for a reply first written here."""
    stmt = transition("running", to, returning=("id", "cancel_requested")).values(
        tools_digest=func.coalesce(RUNS.c.tools_digest, bindparam("digest")),
        attempts=0,
        crashes=0,
        suspect=False,
        error=None,
        text=bindparam("text"),
    )
    if charged:
        stmt = stmt.values(
            turns=RUNS.c.turns + 1,
            prompt_tokens=RUNS.c.prompt_tokens + bindparam("prompt"),
            completion_tokens=RUNS.c.completion_tokens + bindparam("completion"),
            total_tokens=RUNS.c.total_tokens + bindparam("total"),
            cost=RUNS.c.cost + bindparam("cost"),
        )
    return stmt


# What a turn adds to its batch's spending, for a batch with a budget.
CHARGE_BATCH = (
    BATCHES.update()
    .where(BATCHES.c.id == bindparam("bid"))
    .values(
        spent_tokens=BATCHES.c.spent_tokens + bindparam("tokens"),
        spent_cost=BATCHES.c.spent_cost + bindparam("spent"),
    )
)


CANCEL_FLAG = select(RUNS.c.cancel_requested).where(RUNS.c.id == bindparam("rid"))


LEDGER_OUTCOME = select(LEDGER.c.outcome).where(
    LEDGER.c.run_id == bindparam("rid"),
    LEDGER.c.at == bindparam("at"),
    LEDGER.c.call_id == bindparam("cid"),
    LEDGER.c.attempt == bindparam("attempt"),
)


def _insert(dialect: str) -> Any:
    return (sqlite_insert if dialect == "sqlite" else postgresql_insert)(LEDGER)


_LEDGER_KEY = ["run_id", "at", "call_id", "attempt"]


@functools.cache
def ledger_insert(dialect: str) -> Any:
    return _insert(dialect).on_conflict_do_nothing()


@functools.cache
def ledger_start(dialect: str) -> Any:
    stmt = _insert(dialect)
    return stmt.on_conflict_do_update(
        index_elements=_LEDGER_KEY, set_={"executions": LEDGER.c.executions + 1}
    ).returning(LEDGER.c.executions)


@functools.cache
def ledger_finish(dialect: str) -> Any:
    stmt = _insert(dialect)
    # The first outcome recorded stands: a late duplicate of the call changes nothing.
    return stmt.on_conflict_do_update(
        index_elements=_LEDGER_KEY,
        set_={"outcome": stmt.excluded.outcome},
        where=LEDGER.c.outcome.is_(None),
    )


@functools.cache
def upsert_message(dialect: str) -> Any:
    insert = sqlite_insert if dialect == "sqlite" else postgresql_insert
    stmt = insert(MessageRow.__table__)  # type: ignore[attr-defined]
    return stmt.on_conflict_do_update(
        index_elements=["conversation_id", "seq"],
        set_={"body": stmt.excluded.body, "role": stmt.excluded.role},
    )
