"""Issue 19: a worker's heartbeat, on a thread of its own, and what it says of the store."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from store import Database, StoreUnavailable, WorkerRow, migrate
from tasks.runner.heartbeat import Heartbeat

POLL = 0.01
"""Seconds between looks at what is awaited."""


def wait_until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:g} s")
        time.sleep(POLL)


def heartbeat_at(db: Database, worker: str) -> object:
    with db.read() as s:
        row = s.get(WorkerRow, worker)
        return None if row is None else row.heartbeat_at


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Database:
    monkeypatch.setenv("RELAYQ_SQLITE_BUSY_TIMEOUT", "0.3")
    database = Database(f"sqlite:///{tmp_path / 'relayq.db'}")
    migrate(database)
    return database


def test_the_heartbeat_goes_on_while_the_thread_that_started_it_is_blocked(db: Database):
    heart = Heartbeat(db, "w1", every=0.05, timeout=5.0)
    heart.start()
    try:
        first = heartbeat_at(db, "w1")
        assert first is not None, "the first beat is written before start returns"
        # The starting thread blocks (as an event loop stuck in a long call would) ...
        blocked = threading.Event()
        moved: list[object] = []

        def blocker() -> None:
            wait_until(lambda: heartbeat_at(db, "w1") != first, "a later beat")
            moved.append(heartbeat_at(db, "w1"))
            blocked.set()

        watcher = threading.Thread(target=blocker)
        watcher.start()
        blocked.wait(10)  # ... and the beats go on without it
        watcher.join()
        assert moved
        assert moved[0] != first
    finally:
        heart.stop()


def test_a_locked_store_makes_the_heartbeat_unsteady_until_it_has_beaten_a_timeout_again(
    db: Database, tmp_path: Path
):
    # Given a steady heartbeat
    heart = Heartbeat(db, "w1", every=0.05, timeout=30.0)
    heart.start()
    try:
        assert heart.steady()

        # When another process holds SQLite's write lock past the busy timeout
        lock = sqlite3.connect(tmp_path / "relayq.db", isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        wait_until(lambda: not heart.steady(), "the heartbeat to notice the lock")
        before = heartbeat_at(db, "w1")
        lock.execute("COMMIT")
        lock.close()

        # Then beats are written again once it frees, and the heartbeat still says
        # stale heartbeats prove nothing: the other workers could not beat either
        wait_until(lambda: heartbeat_at(db, "w1") != before, "a beat after the lock")
        assert not heart.steady()
    finally:
        heart.stop()


def test_a_store_that_is_down_when_the_heartbeat_starts_is_an_error_at_once(tmp_path: Path):
    missing = Database("postgresql+psycopg://relayq:secret@127.0.0.1:1/none")
    heart = Heartbeat(missing, "w1", every=0.05, timeout=1.0)
    with pytest.raises(StoreUnavailable) as refused:
        heart.start()
    assert "secret" not in str(refused.value)
    assert "127.0.0.1:1" in str(refused.value)
