"""Finished work purged (`store.retention`), on SQLite and PostgreSQL: a finished run goes
with every row of its own, in every table; live work, open requests and the audit trail
stay."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import SQLModel, col, select

from relayq import ConversationPurged, UnknownRequest
from relayq.relay import RelayResult, relay_answer, relay_calls_of
from store import Database, Decider, accept_answer, apply_answer_of, get_request, get_run
from store.leases import lease_calls, lease_result
from store.models import (
    BatchRow,
    DecisionRow,
    DeliveryAttemptRow,
    DeliveryRow,
    EventRow,
    LedgerRow,
    OutboxRow,
    RunRow,
    VoteRow,
    utcnow,
)
from store.retention import KEPT, Purged, purge_finished
from tests import forkserver

from .driver import halt_on_relay, message_rows, run_turn, snapshot, start

TURN = "relayq.run_turn"
ROOT = Path(__file__).resolve().parents[2]
HOST = Decider(name="laptop-1", role="host", via="api")
DAY = timedelta(days=1)
LINKS = ("run_id", "request_id", "event_id", "delivery_id", "batch_id")
"""The columns by which a row belongs to a run, directly or through its parts."""


async def finished_run(
    db: Database, run_id: str, *, batch_id: str | None = None, delivery: str = "delivered"
) -> str:
    """A run that ended 40 days ago with a row in every table a run has rows in: its
    messages, an answered relay request (a lease, its relay call, a vote), a ledger row,
    an outbox row, an event with a webhook delivery in state `delivery` (its attempt),
    and a batch. Returns its request's id."""
    kit, model, turn = await halt_on_relay(db, "c1", run_id=run_id)
    assert turn.pending is not None
    request_id = turn.pending.id
    [lease] = lease_calls(db, tools=["lookup"], holder="laptop-1", limit=1, lease=DAY)
    lease_result(db, lease.lease_id, output="found", is_error=False, host=HOST)
    apply_answer_of(db, request_id)  # as the answer task does
    assert (await run_turn(db, run_id, kit, model)).status == "done"
    long_ago = utcnow() - 40 * DAY
    with db.write() as s:
        event = EventRow(id=f"ev_{run_id}", type="run.finished", run_id=run_id, created_at=long_ago)
        delivery_row = DeliveryRow(
            event_id=event.id, endpoint="ops", state=delivery, next_at=long_ago,
            created_at=long_ago,
        )  # fmt: skip
        s.add_all([event, delivery_row])
        s.flush()
        assert delivery_row.id is not None
        attempt = DeliveryAttemptRow(
            delivery_id=delivery_row.id, event_id=event.id, endpoint="ops", attempt=1, at=long_ago
        )
        s.add_all([
            attempt,
            VoteRow(request_id=request_id, voter="ann", decision="approve", at=long_ago),
            LedgerRow(run_id=run_id, at=0, call_id="c9", attempt="1", created_at=long_ago),
            OutboxRow(task=TURN, queue="relayq.turns", run_id=run_id, created_at=long_ago),
        ])  # fmt: skip
        if batch_id is not None and s.get(BatchRow, batch_id) is None:
            s.add(BatchRow(id=batch_id, agent="agent", created_at=long_ago))
        run = s.get(RunRow, run_id)
        assert run is not None
        run.batch_id = batch_id
        run.updated_at = long_ago
    return request_id


def tables() -> set[str]:
    return {name for name in SQLModel.metadata.tables if name.startswith("relayq_")}


def rows_of(db: Database, run_ids: set[str], request_ids: set[str]) -> dict[str, int]:
    """Rows in each table that belong to these runs, by any link column."""
    found: dict[str, int] = {}
    with db.read() as s:
        event_ids = set(s.exec(select(EventRow.id).where(col(EventRow.run_id).in_(run_ids))))
        delivery_ids = set(
            s.exec(select(DeliveryRow.id).where(col(DeliveryRow.event_id).in_(event_ids)))
        )
        batch_ids = {f"batch_{r}" for r in run_ids}
        ids: dict[str, set[Any]] = {
            "run_id": run_ids,
            "request_id": request_ids,
            "event_id": event_ids,
            "delivery_id": delivery_ids,
            "batch_id": batch_ids,
        }
        for name in sorted(tables()):
            table = SQLModel.metadata.tables[name]
            count = 0
            for column in LINKS:
                if column in table.c and ids[column]:
                    count += (
                        s.exec(
                            select(table).where(table.c[column].in_(ids[column]))  # type: ignore[call-overload]
                        )
                        .all()
                        .__len__()
                    )
            # a run's, a batch's and an event's own rows, by their id
            own = {"relayq_runs": run_ids, "relayq_batches": batch_ids, "relayq_events": event_ids}
            if own.get(name):
                count += len(s.exec(select(table).where(table.c.id.in_(own[name]))).all())  # type: ignore[call-overload]
            found[name] = count
    return found


async def test_a_purge_leaves_no_row_of_a_removed_run_in_any_table(db: Database):
    # Given a run finished 40 days ago with rows in every table, in a batch of its own
    request_id = await finished_run(db, "run_old", batch_id="batch_run_old")
    before = rows_of(db, {"run_old"}, {request_id})
    # (every table but the kept ones has a row of it: a new table needs a rule here)
    assert {t for t, n in before.items() if n} | set(KEPT) >= tables() - set(KEPT)
    assert {t for t, n in before.items() if n} >= tables() - set(KEPT) - {"relayq_workers"}

    # When finished work older than 30 days is purged
    purged = purge_finished(db, utcnow() - 30 * DAY)

    # Then no table but the audit trail keeps a row of it, and the purge counted each
    after = rows_of(db, {"run_old"}, {request_id})
    assert {t: n for t, n in after.items() if n} == {"relayq_decisions": after["relayq_decisions"]}
    assert after["relayq_decisions"] >= 1, "the audit trail stays"
    assert set(purged.rows) == tables() - set(KEPT)
    assert purged.runs == 1
    # ... and the request is unknown now: an answer or a lease for it is a 404
    with pytest.raises(UnknownRequest):
        get_request(db, request_id)


async def test_a_dry_run_counts_what_a_purge_removes_and_removes_nothing(db: Database):
    request_ids = {await finished_run(db, f"run_{i}", batch_id="batch_shared") for i in range(3)}
    runs = {f"run_{i}" for i in range(3)}
    before = rows_of(db, runs, request_ids)

    dry = purge_finished(db, utcnow() - 30 * DAY, dry_run=True, chunk=2)

    assert rows_of(db, runs, request_ids) == before
    real = purge_finished(db, utcnow() - 30 * DAY, chunk=2)
    assert dry.rows == real.rows
    assert real.rows["relayq_batches"] == 1, "the batch goes with its last run, once"


async def test_live_work_recent_runs_and_open_requests_stay(db: Database):
    # Given, beside an old finished run: a queued run, a run waiting on an open request,
    # and a run finished yesterday, each last changed 40 days ago but the last
    await finished_run(db, "run_old")
    await finished_run(db, "run_recent")  # (before another run's call is open to lease)
    start(db, run_id="run_queued")
    await halt_on_relay(db, "c1", run_id="run_waiting")
    long_ago = utcnow() - 40 * DAY
    with db.write() as s:
        for run_id, at in (("run_queued", long_ago), ("run_waiting", long_ago)):
            run = s.get(RunRow, run_id)
            assert run is not None
            run.updated_at = at
        recent = s.get(RunRow, "run_recent")
        assert recent is not None
        recent.updated_at = utcnow() - DAY

    # When work finished over 30 days ago is purged
    purged = purge_finished(db, utcnow() - 30 * DAY)

    # Then only the old finished run went
    assert purged.runs == 1
    for run_id in ("run_queued", "run_waiting", "run_recent"):
        assert get_run(db, run_id).id == run_id
    with db.read() as s:
        assert s.get(RunRow, "run_old") is None
        assert s.exec(select(DecisionRow).where(DecisionRow.run_id == "run_old")).all()


async def test_a_finished_run_with_a_request_still_open_stays(db: Database):
    # Given an old run marked finished while its request is somehow still open
    await halt_on_relay(db, "c1", run_id="run_odd")
    with db.write() as s:
        run = s.get(RunRow, "run_odd")
        assert run is not None
        run.status, run.updated_at = "failed", utcnow() - 40 * DAY

    assert purge_finished(db, utcnow() - 30 * DAY) == Purged()
    assert get_run(db, "run_odd").status == "failed"


async def answer_and_finish(db: Database, run_id: str, kit: Any, model: Any, turn: Any) -> None:
    """The run's relay call answered (accepted, applied as the answer task does), and its
    next turn run to its end."""
    assert turn.pending is not None
    calls = relay_calls_of(turn.pending)
    results = [RelayResult(id=c.id, output=f"found {c.id}") for c in calls]
    accept_answer(db, relay_answer(turn.pending.id, results))
    apply_answer_of(db, turn.pending.id)
    assert (await run_turn(db, run_id, kit, model)).status == "done"


async def test_a_finished_run_stays_while_its_conversation_goes_on(db: Database):
    # Given run r1, done 40 days ago, and r2 continuing its conversation, waiting on a call
    await finished_run(db, "run_r1")
    kit, model, turn = await halt_on_relay(db, "c1", run_id="run_r2", conversation_id="run_r1")
    history = [(m.seq, m.run_id) for m in message_rows(db, "run_r1")]

    # When finished work is purged
    purged = purge_finished(db, utcnow() - 30 * DAY)

    # Then r1 and its messages stay, and r2's answer lands on its placeholder: the run ends
    assert purged.runs == 0
    assert [(m.seq, m.run_id) for m in message_rows(db, "run_r1")] == history
    await answer_and_finish(db, "run_r2", kit, model, turn)
    texts = [m.body.get("content") for m in message_rows(db, "run_r1") if m.run_id == "run_r2"]
    assert texts[-2:] == ["found c1", "finished"]
    # ... and once the conversation has no run going, r1 goes (r2 is recent: it stays)
    assert purge_finished(db, utcnow() - 30 * DAY).runs == 1
    assert get_run(db, "run_r2").status == "done"


async def test_a_conversation_whose_earlier_runs_were_purged_refuses_to_go_on(db: Database):
    # Given a conversation of r1 (purged) and r2 (recent: kept)
    await finished_run(db, "run_a")
    kit, model, turn = await halt_on_relay(db, "c1", run_id="run_b", conversation_id="run_a")
    await answer_and_finish(db, "run_b", kit, model, turn)
    assert purge_finished(db, utcnow() - 30 * DAY).runs == 1
    before = snapshot(db)

    # When a run would continue it: refused, saying why, and nothing is written
    with pytest.raises(ConversationPurged, match="earlier runs were purged") as refused:
        start(db, run_id="run_c", conversation_id="run_a")
    assert (refused.value.kept, refused.value.written) == (len(message_rows(db, "run_a")), 8)
    assert snapshot(db) == before


async def test_a_purge_racing_a_run_that_continues_the_conversation_leaves_no_hole(
    db: Database,
):
    # Given conversations whose only run ended 40 days ago, each raced by a purge and a
    # run continuing it
    for n in range(12):
        await finished_run(db, f"run_old{n}")
        outcome: dict[str, BaseException | None] = {}

        def go_on(n: int = n, outcome: dict[str, BaseException | None] = outcome) -> None:
            try:
                start(db, run_id=f"run_new{n}", conversation_id=f"run_old{n}")
                outcome["start"] = None
            except BaseException as exc:
                outcome["start"] = exc

        racer = threading.Thread(target=go_on)
        racer.start()
        purge_finished(db, utcnow() - 30 * DAY)
        racer.join(30)

        # Then either the purge went first (the conversation went whole, and the run
        # starts it again) or the run did (and the old run stays): positions have no hole
        assert outcome["start"] is None, outcome["start"]
        seqs = [m.seq for m in message_rows(db, f"run_old{n}")]
        assert seqs == list(range(len(seqs))), seqs
        assert get_run(db, f"run_new{n}").start_seq == len(seqs) - 1


async def test_a_conversation_purged_whole_starts_again(db: Database):
    await finished_run(db, "run_gone")
    assert purge_finished(db, utcnow() - 30 * DAY).runs == 1

    start(db, run_id="run_again", conversation_id="run_gone")

    assert [(m.seq, m.run_id) for m in message_rows(db, "run_gone")] == [(0, "run_again")]


async def test_a_run_whose_webhook_delivery_is_not_settled_stays_until_it_is(db: Database):
    # Given an old finished run whose run.finished delivery is still to be sent
    await finished_run(db, "run_hooked", delivery="pending")

    # When finished work is purged, it stays, delivery and all
    assert purge_finished(db, utcnow() - 30 * DAY).runs == 0
    with db.read() as s:
        (delivery,) = s.exec(select(DeliveryRow).where(DeliveryRow.event_id == "ev_run_hooked"))
    # Then once it is given up (or delivered), the run goes with it
    with db.write() as s:
        kept = s.get(DeliveryRow, delivery.id)
        assert kept is not None
        kept.state = "failed"
    assert purge_finished(db, utcnow() - 30 * DAY).runs == 1


def test_a_purge_of_nothing_removes_nothing(db: Database):
    assert purge_finished(db, datetime(2000, 1, 1).astimezone()) == Purged()


async def test_relayq_purge_counts_then_removes_and_refuses_a_bad_age(db: Database, tmp_path: Path):
    # Given an old finished run, and `relayq purge` on its store
    await finished_run(db, "run_old")
    url = db.engine.url.render_as_string(hide_password=False)
    env = {**os.environ, "RELAYQ_HOME": str(tmp_path), "RELAYQ_DATABASE_URL": url}

    def purge(*args: str) -> subprocess.CompletedProcess[str]:
        return forkserver.run(
            [sys.executable, "-m", "cli.main", "purge", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    # When an age it cannot read, or one past any date, is given: a one-line error, and
    # nothing removed
    for age in ("a while", "99999999d", "999999999w"):
        bad = purge("--finished-before", age)
        assert bad.returncode == 1, bad.stderr
        assert bad.stderr.startswith("relayq: error:"), bad.stderr
        assert "Traceback" not in bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    # A dry run says what would go, and removes nothing
    dry = purge("--finished-before", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would remove 1 finished runs" in dry.stdout
    assert get_run(db, "run_old").status == "done"
    # Then the purge removes it, saying so; and again finds nothing
    done = purge("--finished-before", "30d")
    assert done.returncode == 0, done.stderr
    assert "removed 1 finished runs" in done.stdout
    assert "votes" in done.stdout
    with db.read() as s:
        assert s.get(RunRow, "run_old") is None
    again = purge("--finished-before", "30d").stdout
    assert again.startswith("no finished run last changed before"), again
    assert again.rstrip().endswith(": nothing to remove"), again


def test_a_purge_with_nothing_to_remove_takes_no_write_transaction(
    db: Database, monkeypatch: pytest.MonkeyPatch
):
    # Given a store whose only run is live (as every few seconds' sweep mostly finds)
    start(db, run_id="run_live")

    def write() -> None:
        raise AssertionError("the purge took a write transaction (SQLite's lock)")

    # Then a purge finds nothing with a read, and never asks for the write lock
    monkeypatch.setattr(db, "write", write)
    assert purge_finished(db, utcnow(), limit=100) == Purged()
