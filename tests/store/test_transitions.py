"""The run state machine: one table of edges, one compare-and-swap builder, every pair tried."""

from __future__ import annotations

import itertools

import pytest

from store import Database, get_run
from store.models import utcnow
from store.transitions import STATUSES, TRANSITIONS, IllegalTransition, allowed, transition

from .driver import start

PAIRS = list(itertools.product(STATUSES, STATUSES))


@pytest.mark.parametrize(("frm", "to"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_every_pair_of_statuses_is_either_an_edge_or_refused(frm: str, to: str):
    if (frm, to) in TRANSITIONS:
        assert allowed(frm, to)
        assert transition(frm, to) is not None
    else:
        assert not allowed(frm, to)
        with pytest.raises(IllegalTransition, match=f"from {frm!r} to {to!r}"):
            transition(frm, to)


def test_a_finished_run_never_moves_and_every_status_is_reachable():
    assert not [edge for edge in TRANSITIONS if edge[0] in ("done", "failed", "cancelled")]
    assert {to for _, to in TRANSITIONS} | {"queued"} == set(STATUSES)


def test_a_statement_for_several_sources_is_refused_if_any_edge_is_missing():
    with pytest.raises(IllegalTransition):
        transition(("queued", "done"), "cancelled")


def test_the_swap_moves_a_run_only_from_the_status_and_version_it_names(db: Database):
    # Given a queued run at version 0
    start(db)
    claim = transition("queued", "running", returning=("version",))

    with db.transaction() as conn:
        # When a claim names another version, or the run is no longer queued
        stale = conn.execute(claim, {"rid": "run_1", "v": 5, "now": utcnow()}).first()
        took = conn.execute(claim, {"rid": "run_1", "v": 0, "now": utcnow()}).first()
        again = conn.execute(claim, {"rid": "run_1", "v": 0, "now": utcnow()}).first()

    # Then only the one that matched both moved it, and the version counted up
    assert stale is None
    assert took is not None
    assert took.version == 1
    assert again is None
    assert (get_run(db, "run_1").status, get_run(db, "run_1").version) == ("running", 1)


def test_leaving_running_drops_the_claim_and_sets_what_it_names(db: Database):
    start(db)
    now = utcnow()
    with db.transaction() as conn:
        conn.execute(
            transition("queued", "running", sets=("claimed_by", "worker")),
            {"rid": "run_1", "v": 0, "now": now, "claimed_by": "t1", "worker": "w1"},
        )
        conn.execute(
            transition("running", "failed", sets=("error", "attempts")),
            {"rid": "run_1", "v": 1, "now": now, "error": "boom", "attempts_step": 1},
        )
    run = get_run(db, "run_1")
    assert (run.status, run.version, run.error, run.attempts) == ("failed", 2, "boom", 1)
    assert (run.claimed_by, run.worker, run.lease_until) == (None, None, None)
