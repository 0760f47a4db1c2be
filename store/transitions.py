"""The run state machine: every status change a run may make, and the one way to make it.

    queued  --claim-->            running
    running --takeover-->         running     (a redelivery whose worker died)
    running --next turn, retry,
              worker dead-->      queued
    running --turn ended-->       pending | done | incomplete | failed | cancelled
    running --over its budget-->  over_budget (when it may not ask for more)
    pending --answer applied-->   queued
    pending --budget declined-->  over_budget
    pending --answer unusable-->  failed      (its transcript changed behind the store)
    queued  --cancel-->           cancelled
    pending --cancel, expiry-->   cancelled

`transition(frm, to)` builds the compare-and-swap UPDATE for any allowed edge:
it matches the run in `frm` (and at `:v`, when the caller holds a version),
moves it to `to`, bumps its version, stamps `updated_at`, and, leaving
`running`, drops the claim. The statement is built once per edge and reused;
no path writes a run's status by hand. An edge not in the table is an
`IllegalTransition`, raised when the statement is asked for.

A run that finishes has had every message sent for it take effect: `move`
deletes its outbox rows (`SPENT_MESSAGES`).
"""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any, Literal, TypeAlias

from sqlalchemy import bindparam, or_
from sqlmodel import Session

from relayq import RelayqError
from store.errors import StaleClaim
from store.models import FINISHED, OutboxRow, RunRow

__all__ = [
    "STATUSES",
    "TRANSITIONS",
    "IllegalTransition",
    "ONE_MORE_ATTEMPT",
    "ONE_MORE_CRASH",
    "RunStatus",
    "SPENT_MESSAGES",
    "allowed",
    "move",
    "transition",
]

RunStatus: TypeAlias = Literal[
    "queued", "running", "pending", "done", "incomplete", "failed", "cancelled", "over_budget"
]
STATUSES: tuple[RunStatus, ...] = (
    "queued", "running", "pending", "done", "incomplete", "failed", "cancelled", "over_budget",
)  # fmt: skip

TRANSITIONS: frozenset[tuple[str, str]] = frozenset(
    {
        ("queued", "running"),
        ("running", "running"),
        ("running", "queued"),
        ("running", "pending"),
        ("running", "done"),
        ("running", "incomplete"),
        ("running", "failed"),
        ("running", "cancelled"),
        ("running", "over_budget"),
        ("pending", "queued"),
        ("pending", "failed"),
        ("pending", "over_budget"),
        ("queued", "cancelled"),
        ("pending", "cancelled"),
    }
)
assert all(frm not in FINISHED for frm, _ in TRANSITIONS), "a finished run never moves"


class IllegalTransition(RelayqError):
    """A run cannot go from `frm` to `to`: the state machine has no such edge."""

    def __init__(self, frm: str, to: str) -> None:
        super().__init__(frm, to)
        self.frm = frm
        self.to = to

    def __str__(self) -> str:
        return f"a run cannot go from {self.frm!r} to {self.to!r}"


def allowed(frm: str, to: str) -> bool:
    return (frm, to) in TRANSITIONS


_RUNS = RunRow.__table__  # type: ignore[attr-defined]
_OUTBOX = OutboxRow.__table__  # type: ignore[attr-defined]
_CLAIM_FIELDS = ("claimed_by", "worker", "lease_until", "held_alone")


@functools.cache
def transition(
    frm: str | tuple[str, ...],
    to: str,
    *,
    versioned: bool = True,
    sets: tuple[str, ...] = (),
    returning: tuple[str, ...] = (),
) -> Any:
    """The compare-and-swap UPDATE moving a run from `frm` (one status or several) to `to`.

    Parameters: `:rid`, `:now`, `:v` when `versioned`, and one per name in `sets`
    (a column given a value, or `attempts` counted up with `attempts_step`).
    `returning` names the columns to read back. Zero rows updated means the run
    was not where the caller thought: its claim or its view is stale.
    """
    sources = (frm,) if isinstance(frm, str) else frm
    for source in sources:
        if not allowed(source, to):
            raise IllegalTransition(source, to)
    # Comparisons, not IN: an IN list is an "expanding" parameter, its SQL rendered again
    # on every execution, and every turn runs two of these (issue 38).
    where = [_RUNS.c.id == bindparam("rid"), or_(*(_RUNS.c.status == s for s in sources))]
    if versioned:
        where.append(_RUNS.c.version == bindparam("v"))
    values: dict[str, Any] = {
        "status": to,
        "version": _RUNS.c.version + 1,
        "updated_at": bindparam("now"),
    }
    if to != "running":
        values |= dict.fromkeys(_CLAIM_FIELDS)
    for name in sets:
        if name == "attempts":
            values["attempts"] = _RUNS.c.attempts + bindparam("attempts_step")
        else:
            values[name] = bindparam(name)
    stmt = _RUNS.update().where(*where).values(**values)
    if returning:
        stmt = stmt.returning(*(_RUNS.c[name] for name in returning))
    return stmt


def move(s: Session, run: RunRow, to: str, *, now: datetime, **values: Any) -> None:
    """Move a run the caller has locked (and read) to `to`, through its edge's swap.

    `values` are more columns to set (an expression such as `attempts + 1` too).
    The row is expired afterwards: reading it again reads what was written.
    """
    stmt = transition(run.status, to)
    if values:
        stmt = stmt.values(**values)
    done = s.execute(stmt, {"rid": run.id, "v": run.version, "now": now})
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise StaleClaim(run.id, run.version)
    if to in FINISHED:
        s.execute(SPENT_MESSAGES, {"rid": run.id})
    s.expire(run)


SPENT_MESSAGES = _OUTBOX.delete().where(_OUTBOX.c.run_id == bindparam("rid"))
"""A finished run's outbox rows: every message sent for it has had its effect (a late
duplicate finds the run finished and does nothing), so the outbox keeps none of them."""


ONE_MORE_ATTEMPT = _RUNS.c.attempts + 1
"""For `move(..., attempts=ONE_MORE_ATTEMPT)`: a failed try of the model call."""
ONE_MORE_CRASH = _RUNS.c.crashes + 1
"""For `move(..., crashes=ONE_MORE_CRASH)`: the turn's worker died holding it."""


def died_holding(run: RunRow) -> dict[str, Any]:
    """For `move(..., **died_holding(run))`: the run's worker died holding it. A death is
    counted against the turn (`RELAYQ_CRASH_LIMIT`) only when the turn had its process to
    itself; a process that ran other turns too may have died of any of them, so each of
    those turns is marked `suspect` instead, and runs alone next (`tasks.runner.alone`), where
    a death tells."""
    return {"crashes": ONE_MORE_CRASH if run.held_alone else run.crashes, "suspect": True}
