"""The retentions besides the runs' (`store.retention`), on SQLite and PostgreSQL: webhook
events once settled, the audit trail, the export a purge writes first, and SQLite's space
given back."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import text, update
from sqlmodel import col, select

from store import Database, retention
from store.models import (
    DecisionRow,
    DeliveryAttemptRow,
    DeliveryRow,
    EventRow,
    MessageRow,
    RunRow,
    utcnow,
)
from store.retention import give_back_space, purge_decisions, purge_events, purge_finished
from tests import forkserver

from .test_retention import DAY, ROOT, finished_run


def event(s: Any, event_id: str, *, age_days: float, states: tuple[str, ...]) -> None:
    """An event made `age_days` ago, with a delivery (and its attempt) in each state."""
    at = utcnow() - age_days * DAY
    s.add(EventRow(id=event_id, type="request.opened", created_at=at))
    for n, state in enumerate(states):
        delivery = DeliveryRow(
            event_id=event_id, endpoint=f"hook{n}", state=state, next_at=at, created_at=at
        )
        s.add(delivery)
        s.flush()
        assert delivery.id is not None
        s.add(
            DeliveryAttemptRow(
                delivery_id=delivery.id, event_id=event_id, endpoint=f"hook{n}", attempt=1, at=at
            )
        )


def test_webhook_events_go_once_settled_and_old_with_their_deliveries(db: Database):
    # Given events 8 days old (delivered; given up; one of two deliveries pending; none
    # wanted), and one delivered yesterday
    with db.write() as s:
        event(s, "ev_delivered", age_days=8, states=("delivered",))
        event(s, "ev_failed", age_days=8, states=("failed", "delivered"))
        event(s, "ev_pending", age_days=8, states=("delivered", "pending"))
        event(s, "ev_unwanted", age_days=8, states=())
        event(s, "ev_recent", age_days=1, states=("delivered",))

    # When events are kept 7 days, two a transaction
    purged = purge_events(db, utcnow() - 7 * DAY, chunk=2)

    # Then the old settled ones went with their deliveries and attempts; a pending
    # delivery keeps its event, and a recent event stays
    with db.read() as s:
        left = set(s.exec(select(EventRow.id)))
        deliveries = {d.event_id for d in s.exec(select(DeliveryRow))}
        attempts = {a.event_id for a in s.exec(select(DeliveryAttemptRow))}
    assert left == {"ev_pending", "ev_recent"}
    assert deliveries == attempts == {"ev_pending", "ev_recent"}
    assert purged.rows == {
        "relayq_events": 3,
        "relayq_deliveries": 3,
        "relayq_delivery_attempts": 3,
    }
    assert purge_events(db, utcnow() - 7 * DAY).rows == {}


def decision(run_id: str, *, age_days: float) -> DecisionRow:
    return DecisionRow(
        request_id=f"req_{run_id}", run_id=run_id, agent="refunds", tool="refund",
        actor="alice", via="inbox", outcome="approved", at=utcnow() - age_days * DAY,
    )  # fmt: skip


async def test_the_audit_trail_outlives_its_runs_and_goes_only_past_its_own_retention(
    db: Database,
):
    # Given a run finished 40 days ago (its decision made then), and decisions of a year
    # ago and of last week
    await finished_run(db, "run_old")
    with db.write() as s:
        s.add_all([decision("run_ancient", age_days=365), decision("run_week", age_days=7)])

    # When the run is purged: its decision stays, naming its run, agent and tool
    assert purge_finished(db, utcnow() - 30 * DAY).runs == 1
    with db.read() as s:
        kept = s.exec(select(DecisionRow).where(DecisionRow.run_id == "run_old")).all()
    assert kept
    assert all(d.agent and d.request_id and d.actor for d in kept)

    # When the audit trail is kept 90 days, one row a transaction
    assert purge_decisions(db, utcnow() - 90 * DAY, chunk=1) == 1

    # Then only the year-old decision went
    with db.read() as s:
        runs = {d.run_id for d in s.exec(select(DecisionRow))}
    assert "run_ancient" not in runs
    assert {"run_old", "run_week"} <= runs


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def test_an_export_takes_each_run_before_it_goes_and_one_it_could_not_keep_stays(
    db: Database,
):
    # Given five runs finished 40 days ago, two in one batch
    for n in range(5):
        await finished_run(db, f"run_{n}", batch_id="batch_pair" if n < 2 else None)
    written: list[dict[str, Any]] = []

    def keeps_two_chunks(runs: list[dict[str, Any]]) -> None:
        if len(written) >= 4:
            raise OSError(28, "No space left on device")
        written.extend(runs)

    # When a purge two runs a transaction exports each chunk first, and the third fails
    with pytest.raises(OSError, match="No space"):
        purge_finished(db, utcnow() - 30 * DAY, chunk=2, export=keeps_two_chunks)

    # Then the four runs exported went, and the one it could not export stays
    gone = {line["run"]["id"] for line in written}
    assert len(gone) == 4
    with db.read() as s:
        left = set(s.exec(select(RunRow.id).where(col(RunRow.id).like("run_%"))))
    assert left == {f"run_{n}" for n in range(5)} - gone
    # ... and each line held the run, its transcript, requests, decisions, batch and job
    line = next(x for x in written if x["run"]["id"] == "run_0")
    assert set(line) == {"run", "transcript", "requests", "decisions", "batch", "job"}
    assert [m["role"] for m in line["transcript"]][:2] == ["user", "assistant"]
    assert line["requests"][0]["run_id"] == "run_0"
    assert line["decisions"]
    assert line["batch"]["id"] == "batch_pair"
    assert line["job"] == {"id": None, "index": None}


async def test_relayq_purge_export_writes_a_line_a_run_and_refuses_what_it_cannot(
    db: Database, tmp_path: Path
):
    # Given two old finished runs, and `relayq purge` on their store
    for n in range(2):
        await finished_run(db, f"run_{n}")
    url = db.engine.url.render_as_string(hide_password=False)
    env = {**os.environ, "RELAYQ_HOME": str(tmp_path), "RELAYQ_DATABASE_URL": url}

    def purge(*args: str) -> subprocess.CompletedProcess[str]:
        return forkserver.run(
            [sys.executable, "-m", "cli.main", "purge", "--finished-before", "30d", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    # When the export's folder is a file, or the purge is a dry run: a clear error, and
    # nothing removed
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    refused = [purge("--export", str(blocker)), purge("--export", str(tmp_path), "--dry-run")]
    for bad in refused:
        assert bad.returncode != 0
        assert bad.stderr.startswith("relayq: error: "), bad.stderr
    with db.read() as s:
        assert len(s.exec(select(RunRow.id)).all()) == 2

    # When it exports to a new folder
    done = purge("--export", str(tmp_path / "archive"))

    # Then one line a run went to a new file only its owner reads, and the runs went
    assert done.returncode == 0, done.stderr
    [path] = (tmp_path / "archive").iterdir()
    assert f"wrote 2 runs to {path}" in done.stdout.replace("\n", "")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = read_lines(path)
    assert sorted(line["run"]["id"] for line in lines) == ["run_0", "run_1"]
    with db.read() as s:
        assert s.exec(select(RunRow.id)).all() == []
        assert s.exec(select(MessageRow.run_id)).all() == []


async def test_a_purge_gives_sqlite_its_space_back(lite: Database):
    db = lite
    # Given a new store (made with incremental auto-vacuum) with 30 old finished runs
    for n in range(30):
        await finished_run(db, f"run_{n}")
    with db.connect() as conn:
        assert conn.execute(text("PRAGMA auto_vacuum")).scalar() == 2
        before = conn.execute(text("PRAGMA page_count")).scalar()

    # When they are purged
    purge_finished(db, utcnow() - 30 * DAY, chunk=10)

    # Then no free page is left in the file: the file is smaller
    with db.connect() as conn:
        assert conn.execute(text("PRAGMA freelist_count")).scalar() == 0
        after = conn.execute(text("PRAGMA page_count")).scalar()
    assert after is not None
    assert before is not None
    assert after < before
    assert give_back_space(db) == 0


async def test_a_purge_of_runs_and_a_sweep_of_events_racing_over_the_same_rows_both_finish(
    pg: Database,
):
    # Given 120 runs finished 40 days ago, each with a settled event (delivered, with
    # its attempt), as a purge meets them beside the sweeps' webhook retention
    db = pg
    for n in range(120):
        await finished_run(db, f"run_{n}")
    with db.write() as s:
        s.execute(update(DeliveryRow).values(state="delivered"))

    # When a purge of the runs and a purge of the events race, a few rows a transaction
    async def both() -> tuple[object, ...]:
        return await asyncio.gather(
            asyncio.to_thread(purge_finished, db, utcnow() - 30 * DAY, chunk=5),
            asyncio.to_thread(purge_events, db, utcnow() - 7 * DAY, chunk=5),
            asyncio.to_thread(purge_events, db, utcnow() - 7 * DAY, chunk=3),
            return_exceptions=True,
        )

    outcomes = await both()

    # Then neither failed (no deadlock), and nothing of the runs is left
    assert not [o for o in outcomes if isinstance(o, BaseException)], outcomes
    with db.read() as s:
        assert s.exec(select(RunRow.id)).all() == []
        assert s.exec(select(EventRow.id)).all() == []
        assert s.exec(select(DeliveryAttemptRow.id)).all() == []


async def test_a_purge_of_runs_meeting_a_sweep_that_locked_their_events_waits_for_it(
    pg: Database, monkeypatch: pytest.MonkeyPatch
):
    # Given a run finished 40 days ago whose event (delivered) a sweep of the events has
    # locked, and holds there: the interleaving in which the two deadlocked
    db = pg
    await finished_run(db, "run_met")
    with db.write() as s:
        s.execute(update(DeliveryRow).values(state="delivered"))
    locked, go = threading.Event(), threading.Event()
    drop_events = retention._drop_events

    def held_by_the_sweep(*args: Any, **kw: Any) -> None:
        if threading.current_thread().name == "sweep" and not locked.is_set():
            locked.set()  # its events are locked, its deliveries not yet removed
            go.wait(30)
        drop_events(*args, **kw)

    monkeypatch.setattr(retention, "_drop_events", held_by_the_sweep)
    failed: list[BaseException] = []

    def run(target: Any, *args: Any) -> None:
        try:
            target(db, *args)
        except BaseException as exc:  # the test reads it
            failed.append(exc)

    sweep = threading.Thread(target=run, args=(purge_events, utcnow() - 7 * DAY), name="sweep")
    purge = threading.Thread(target=run, args=(purge_finished, utcnow() - 30 * DAY))
    sweep.start()
    assert await asyncio.to_thread(locked.wait, 30)

    # When the purge of runs meets those events, and the sweep then goes on
    purge.start()
    # (it reaches the events and waits: for their lock, or, without it, for their rows)
    deadline = time.monotonic() + 30
    while not waiting_on_a_lock(db):
        assert time.monotonic() < deadline, "the purge never met the sweep's lock"
        await asyncio.sleep(0.02)
    go.set()
    await asyncio.to_thread(sweep.join, 60)
    await asyncio.to_thread(purge.join, 60)

    # Then both finish, neither a deadlock's victim, and nothing of the run is left
    assert not failed, failed
    with db.read() as s:
        assert s.exec(select(RunRow.id)).all() == []
        assert s.exec(select(EventRow.id)).all() == []
        assert s.exec(select(DeliveryRow.id)).all() == []


async def test_on_sqlite_a_purge_leaves_the_write_lock_free_between_its_transactions(
    db: Database, monkeypatch: pytest.MonkeyPatch
):
    # Given 30 old finished runs, and a record of the purge's write transactions and pauses
    for n in range(30):
        await finished_run(db, f"run_{n}")
    happened: list[tuple[str, float]] = []
    began: dict[int, float] = {}
    engine = db.engines[-1]  # SQLite's writers' engine; PostgreSQL's one engine

    def begin(conn: Any) -> None:
        began[id(conn)] = time.monotonic()

    def commit(conn: Any) -> None:
        if id(conn) in began:
            happened.append(("transaction", time.monotonic() - began.pop(id(conn))))

    free_at_pauses: list[bool] = []

    def pause(seconds: float) -> None:
        happened.append(("pause", seconds))
        free_at_pauses.append(write_lock_free(db))

    monkeypatch.setattr(retention, "_sleep", pause)
    sqlalchemy.event.listen(engine, "begin", begin)
    sqlalchemy.event.listen(engine, "commit", commit)
    try:
        # When they are purged, 10 a transaction
        purge_finished(db, utcnow() - 30 * DAY, chunk=10)
    finally:
        sqlalchemy.event.remove(engine, "begin", begin)
        sqlalchemy.event.remove(engine, "commit", commit)

    kinds = [kind for kind, _ in happened]
    if not db.is_sqlite:
        # Then on PostgreSQL (row locks, no lock of the whole store) it never pauses
        assert "pause" not in kinds
        return
    # Then on SQLite each write transaction after the first of a run of them waits twice
    # as long as the one before it held the lock: 3 chunks, then the space given back
    assert kinds[:5] == ["transaction", "pause", "transaction", "pause", "transaction"], kinds
    for at, (kind, seconds) in enumerate(happened):
        if kind == "pause":
            assert happened[at - 1][0] == happened[at + 1][0] == "transaction", kinds
            assert seconds >= retention.PAUSE * happened[at - 1][1]
    # ... and in each pause another process could have taken the write lock at once
    assert free_at_pauses
    assert all(free_at_pauses), free_at_pauses


def waiting_on_a_lock(db: Database) -> bool:
    """Whether a session of this PostgreSQL database waits for a lock another holds."""
    with db.connect() as conn:
        waiting = conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
        ).scalar()
    return bool(waiting)


def write_lock_free(db: Database) -> bool:
    """Whether SQLite's write lock can be taken this instant, from a connection of its own
    (as another process's would be): BEGIN IMMEDIATE with no wait."""
    path = db.engine.url.database
    assert path is not None
    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:  # database is locked
        return False
    finally:
        probe.close()


def test_on_sqlite_each_chunk_is_found_by_the_runs_time_and_the_requests_run(lite: Database):
    # SQLite's planner, with no statistics, took the index on status instead: it sorted
    # every finished run for each chunk, 73 ms a chunk at 200,000 runs (bench.retention).
    query = retention._next(utcnow(), (utcnow(), "run_x"), 50, lock=False, sqlite=True)
    with lite.connect() as conn:
        compiled = query.compile(conn, compile_kwargs={"literal_binds": True})
        plan = [row[3] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}")]
    assert any("INDEX ix_relayq_runs_updated_at" in step for step in plan), plan
    assert any("INDEX ix_relayq_requests_run_id" in step for step in plan), plan
    assert not any("TEMP B-TREE FOR ORDER BY" in step for step in plan), plan


async def test_on_postgresql_a_purge_gives_the_planner_statistics_of_the_runs_first(
    pg: Database,
):
    # PostgreSQL's planner, with no statistics of runs loaded a moment before, guessed a
    # dozen where tens of thousands were left and sorted them all for each chunk: 62 ms a
    # chunk, 284 runs a second purged (bench.retention, 200,000 runs).
    await finished_run(pg, "run_old")
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(" ".join(statement.split())[:40])

    sqlalchemy.event.listen(pg.engine, "before_cursor_execute", seen)
    try:
        purged = purge_finished(pg, utcnow())
    finally:
        sqlalchemy.event.remove(pg.engine, "before_cursor_execute", seen)

    assert purged.runs == 1
    assert sent[0] == "ANALYZE relayq_runs", sent[:3]
    assert sum(s.startswith("ANALYZE") for s in sent) == 1


async def test_a_sweeps_purge_of_one_chunk_and_a_dry_run_analyze_nothing(pg: Database):
    # A worker's sweep purges one chunk every few seconds: an ANALYZE each would cost more
    # than the chunk
    await finished_run(pg, "run_old")
    sent: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        sent.append(statement)

    sqlalchemy.event.listen(pg.engine, "before_cursor_execute", seen)
    try:
        assert purge_finished(pg, utcnow(), dry_run=True).runs == 1
        assert purge_finished(pg, utcnow(), limit=retention.CHUNK).runs == 1
    finally:
        sqlalchemy.event.remove(pg.engine, "before_cursor_execute", seen)

    assert sent
    assert not [s for s in sent if "ANALYZE" in s]
