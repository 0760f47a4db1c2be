"""SQLite's write transactions of one process (`store.sqlite_writes`): the process's own
writers wait for one another, and only another process's lock makes an impatient first
write give up (issue 38: the loop's calls had gone to threads one after another)."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event, text

from store import Database, StoreBusy, StoreUnavailable
from store.db import impatient


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Database]:
    monkeypatch.setenv("RELAYQ_SQLITE_BUSY_TIMEOUT", "5")
    database = Database(f"sqlite:///{tmp_path / 'writes.db'}")
    with database.transaction() as conn:
        conn.execute(text("CREATE TABLE IF NOT EXISTS steps (who TEXT)"))
    try:
        yield database
    finally:
        database.dispose()


def _write(db: Database, who: str) -> None:
    with db.transaction() as conn:
        conn.execute(text("INSERT INTO steps VALUES (:who)"), {"who": who})


def _steps(db: Database) -> list[str]:
    with db.connect() as conn:
        return [row[0] for row in conn.execute(text("SELECT who FROM steps ORDER BY rowid"))]


@pytest.fixture
def other_process_lock(db: Database) -> Iterator[sqlite3.Connection]:
    """SQLite's write lock, held by a connection of no `Database` of ours: as another
    process's would be."""
    path = str(db.engine.url.database)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield holder
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()


def test_an_impatient_write_waits_for_a_writer_of_its_own_process(db: Database):
    # Given a thread of this process in a write transaction (as a heartbeat would be)
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.transaction() as conn:
            conn.execute(text("INSERT INTO steps VALUES ('thread')"))
            inside.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(10)
    threading.Timer(0.3, release.set).start()

    # When the loop's impatient first write comes meanwhile
    # Then it waits for that transaction, and is not told the store is busy
    with impatient():
        _write(db, "loop")
    holder.join(10)
    assert _steps(db) == ["thread", "loop"]


def test_an_impatient_write_gives_up_at_once_when_another_process_holds_the_lock(
    db: Database, other_process_lock: sqlite3.Connection
):
    started = time.monotonic()
    with pytest.raises(StoreBusy), impatient():
        _write(db, "loop")
    assert time.monotonic() - started < 1.0  # no busy timeout waited out (it is 5 s)
    other_process_lock.execute("ROLLBACK")
    assert _steps(db) == []


def test_a_patient_write_waits_for_another_processs_lock_and_goes_through(
    db: Database, other_process_lock: sqlite3.Connection
):
    threading.Timer(0.3, lambda: other_process_lock.execute("COMMIT")).start()
    _write(db, "patient")
    assert _steps(db) == ["patient"]


def test_a_write_waiting_for_another_process_holds_up_none_of_its_own(
    db: Database, other_process_lock: sqlite3.Connection
):
    # Given a thread of ours waiting for another process's lock (told once it is locked)
    refused = threading.Event()
    for engine in db.engines:
        event.listen(engine, "handle_error", lambda _context: refused.set())
    waiting = threading.Thread(target=_write, args=(db, "waiting"))
    waiting.start()
    assert refused.wait(10)

    # When the loop's impatient write comes meanwhile
    # Then it is told at once the store is busy: the waiting thread holds no lock of ours
    with pytest.raises(StoreBusy), impatient():
        _write(db, "loop")
    assert waiting.is_alive()

    # And once the other process lets go, the waiting write goes through
    other_process_lock.execute("COMMIT")
    waiting.join(10)
    assert _steps(db) == ["waiting"]


def test_a_lock_held_past_the_busy_timeout_is_an_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RELAYQ_SQLITE_BUSY_TIMEOUT", "0.5")
    db = Database(f"sqlite:///{tmp_path / 'held.db'}")
    try:
        with db.transaction() as conn:
            conn.execute(text("CREATE TABLE steps (who TEXT)"))
        holder = sqlite3.connect(str(tmp_path / "held.db"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(StoreUnavailable, match="locked"):
                _write(db, "late")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        # And the process's lock was let go: the next write goes through
        _write(db, "after")
        assert _steps(db) == ["after"]
    finally:
        db.dispose()
