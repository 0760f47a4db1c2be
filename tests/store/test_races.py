"""Two writers on one row, interleaved for real on PostgreSQL.

PostgreSQL runs transactions side by side: a writer that reads a row without
locking it may overwrite what another committed meanwhile. To interleave two
store calls deterministically, the test holds a table lock that stalls the
first call's INSERT (after it took its row locks), starts the second, and
lets both go once the second is waiting too. SQLite takes its write lock at
BEGIN, so its transactions never interleave: these tests are PostgreSQL's
(the `pg` fixture).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from relayq import ResumeError
from relayq.loop import take_turn
from relayq.relay import answer_output
from store import (
    Accepted,
    Database,
    StaleClaim,
    accept_answer,
    apply_answer_of,
    cancel_run,
    claim_turn,
    expire_requests,
    finish_turn,
    get_request,
    get_run,
    sweep,
    transcript,
)
from store.models import utcnow
from store.outbox import mark_published
from tests.relayq.scripted import text as reply

from .driver import (
    ANSWER_TASK,
    LEASE,
    TURN_TASK,
    halt_on_relay,
    local_kit,
    model_of,
    outbox_rows,
    start,
)


def lock_waiters(db: Database) -> int:
    with db.engine.connect() as conn:  # a new transaction sees fresh statistics
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@contextmanager
def inserts_stalled(db: Database, table: str) -> Iterator[None]:
    """INSERTs into `table` wait until the block ends."""
    with db.engine.connect() as conn:
        conn.execute(text(f"LOCK TABLE {table} IN EXCLUSIVE MODE"))
        try:
            yield
        finally:
            conn.commit()


def interleave(
    db: Database, table: str, first: Callable[[Database], Any], second: Callable[[Database], Any]
) -> tuple[Future[Any], Future[Any]]:
    """`first` stalls on its INSERT into `table` holding its locks; `second` runs against it."""
    dbs = [Database(db.url), Database(db.url)]
    pool = ThreadPoolExecutor(2)
    try:
        with inserts_stalled(db, table):
            one = pool.submit(first, dbs[0])
            wait_until(lambda: lock_waiters(db) >= 1)
            two = pool.submit(second, dbs[1])
            # The second either waits on a lock too, or (skipping locked rows) is done.
            wait_until(lambda: two.done() or lock_waiters(db) >= 2)
        one.exception(timeout=30)
        two.exception(timeout=30)
        return one, two
    finally:
        pool.shutdown(wait=True)
        for d in dbs:
            d.dispose()


async def test_an_answer_accepted_while_the_sweeper_expires_its_request_is_not_overwritten(
    pg: Database,
):
    # Given a request that expires in an hour
    _, _, turn = await halt_on_relay(pg, "c1", request_ttl=timedelta(hours=1))
    assert turn.pending is not None
    rid = turn.pending.id
    late = utcnow() + timedelta(hours=2)

    # When a host's answer is being accepted just as the sweeper (whose clock
    # says the hour is up) expires the request
    accepting, expiring = interleave(
        pg,
        "relayq_outbox",
        lambda d: accept_answer(d, answer_output(rid, "42"), answered_by="host"),
        lambda d: expire_requests(d, now=late),
    )

    # Then exactly one of them wins, and the request says which
    stored = get_request(pg, rid)
    sent = outbox_rows(pg, ANSWER_TASK)
    if accepting.exception() is None:
        assert isinstance(accepting.result(), Accepted)
        assert (stored.status, stored.answered_by) == ("answered", "host")
        assert stored.answer == answer_output(rid, "42")
    else:
        assert isinstance(accepting.exception(), ResumeError)
        assert stored.status == "expired"
    assert len(sent) == 1, [(r.id, r.label) for r in sent]
    assert expiring.exception() is None


async def test_a_turn_finishing_while_the_sweeper_requeues_its_run_is_not_overwritten(
    pg: Database,
):
    # Given a running run whose lease the sweeper's clock says ran out
    kit = await local_kit()
    start(pg)
    held = claim_turn(pg, "run_1", 0, task_id="t", lease=LEASE)
    assert held is not None
    before = transcript(pg, "run_1")
    turn = await take_turn(before, kit, model_of(reply("all done")), run_id="run_1")
    mark_published(pg, outbox_rows(pg))
    late = utcnow() + LEASE + timedelta(minutes=1)

    # When its worker finishes the turn just as the sweeper requeues the run
    finishing, sweeping = interleave(
        pg,
        "relayq_messages",
        lambda d: finish_turn(d, held, before, turn, tools_digest="d"),
        lambda d: sweep(d, now=late),
    )

    # Then exactly one of them wins, and the run says which
    run = get_run(pg, "run_1")
    if finishing.exception() is None:
        assert (run.status, run.text) == ("done", "all done")
        assert sweeping.result().requeued == []
        assert outbox_rows(pg, TURN_TASK)[1:] == []
    else:
        assert isinstance(finishing.exception(), StaleClaim)
        assert run.status == "queued"


async def test_an_answer_and_a_cancel_racing_end_with_exactly_one_winner(pg: Database):
    # Given a run pending on a request
    _, _, turn = await halt_on_relay(pg, "c1")
    assert turn.pending is not None
    rid = turn.pending.id

    # When the answer is being accepted (its locks taken) as a cancel comes in
    accepting, cancelling = interleave(
        pg,
        "relayq_outbox",
        lambda d: accept_answer(d, answer_output(rid, "42"), answered_by="host"),
        lambda d: cancel_run(d, "run_1"),
    )

    # Then the answer won the request, and the cancel stopped the run without
    # overwriting it: the request stays answered, and is never applied
    assert accepting.exception() is None
    assert cancelling.exception() is None
    assert get_request(pg, rid).status == "answered"
    assert get_run(pg, "run_1").status == "cancelled"
    assert apply_answer_of(pg, rid) == []


async def test_a_cancel_holding_the_run_makes_a_racing_answer_refused(pg: Database):
    # Given a run pending on a request
    _, _, turn = await halt_on_relay(pg, "c1")
    assert turn.pending is not None
    rid = turn.pending.id

    # When a cancel holds the run (stalled on closing its requests) as the answer comes
    cancelling, accepting = interleave(
        pg,
        "relayq_requests",
        lambda d: cancel_run(d, "run_1"),
        lambda d: accept_answer(d, answer_output(rid, "42"), answered_by="host"),
    )

    # Then the cancel won: the answer is refused and the request says cancelled
    assert cancelling.exception() is None
    assert isinstance(accepting.exception(), ResumeError)
    assert get_request(pg, rid).status == "cancelled"
    assert outbox_rows(pg, ANSWER_TASK) == []


@pytest.mark.parametrize("round_", range(10))
async def test_answers_and_cancels_racing_freely_agree_with_the_request(db: Database, round_: int):
    # Given a run pending on a request, and two clients released together
    _, _, turn = await halt_on_relay(db, "c1")
    assert turn.pending is not None
    rid = turn.pending.id
    dbs = [Database(db.url), Database(db.url)]
    gate = threading.Barrier(2)

    def answer() -> Accepted:
        gate.wait()
        return accept_answer(dbs[0], answer_output(rid, "42"))

    def cancel() -> str:
        gate.wait()
        return cancel_run(dbs[1], "run_1")

    try:
        with ThreadPoolExecutor(2) as pool:
            answered, cancelled = pool.submit(answer), pool.submit(cancel)
            answered.exception(timeout=30)
            cancelled.exception(timeout=30)
    finally:
        for d in dbs:
            d.dispose()

    # Then the request's status says who won: answered iff the answer was accepted
    status = get_request(db, rid).status
    assert cancelled.exception() is None
    assert get_run(db, "run_1").status == "cancelled"
    if answered.exception() is None:
        assert status == "answered"
    else:
        assert isinstance(answered.exception(), ResumeError)
        assert status == "cancelled"
