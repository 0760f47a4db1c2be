"""A child of the worker's main process is never forked while a thread of it is inside the
store (`workers.forks`): it would inherit the store library's mutexes held, and hang. The
guard, and the one thread of the main process that reads the store (the batch queues')."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from sqlalchemy import event

from tasks.settings import Settings
from workers import forks
from workers.batch_queues import BatchQueues
from workers.forks import no_fork_meanwhile


def test_a_fork_waits_for_a_thread_inside_the_store_to_leave_it():
    # Given a thread inside `no_fork_meanwhile()` until told to leave
    inside, leave = threading.Event(), threading.Event()
    left: list[bool] = []

    def in_store() -> None:
        with no_fork_meanwhile():
            inside.set()
            leave.wait(30)
            left.append(True)

    thread = threading.Thread(target=in_store)
    thread.start()
    assert inside.wait(30)

    # When the main thread forks, the thread told to leave only after the fork has begun
    timer = threading.Timer(0.2, leave.set)
    timer.start()
    pid = os.fork()
    if pid == 0:  # the child: whether the thread had left when it was forked
        os._exit(0 if left else 1)
    _, status = os.waitpid(pid, 0)
    thread.join()
    timer.join()

    # Then the child was forked once the thread had left
    assert os.waitstatus_to_exitcode(status) == 0, "forked while a thread was in the store"


def test_a_fork_from_inside_the_block_goes_ahead():
    # A thread that forks from inside the block itself (the lock is its own) is not stopped
    with no_fork_meanwhile():
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_batch_queue_watcher_reads_the_store_with_no_fork_meanwhile(tmp_path: Path):
    # Given the worker's batch-queue watcher (its Celery consumer aside) on a store, and
    # each of its statements watched: could another thread fork the process just then?
    url = f"sqlite:///{tmp_path / 'relayq.db'}"
    watcher = BatchQueues.__new__(BatchQueues)
    watcher.settings = Settings.from_env({"RELAYQ_HOME": str(tmp_path), "RELAYQ_DATABASE_URL": url})
    watcher.bases = ("relayq.turns",)
    watcher._db = None
    db = watcher._database()
    forkable: list[bool] = []

    def could_fork() -> None:
        # A fork takes the guard first (os.register_at_fork): if this thread can, it could.
        taken = forks._GUARD.acquire(blocking=False)
        if taken:
            forks._GUARD.release()
        forkable.append(taken)

    def statement(*_: object) -> None:
        other = threading.Thread(target=could_fork)
        other.start()
        other.join()

    event.listen(db.engine, "before_cursor_execute", statement)
    try:
        # When it reads the active batches, as its thread does each look
        assert watcher.active() == set()
    finally:
        event.remove(db.engine, "before_cursor_execute", statement)
        db.dispose()

    # Then no statement ran while a fork could have begun
    assert forkable
    assert not any(forkable), forkable
