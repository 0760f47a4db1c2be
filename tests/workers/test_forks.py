"""A child of the worker's main process is never forked while a thread of it is inside the
store (`workers.forks`): it would inherit the store library's mutexes held, and hang."""

from __future__ import annotations

import os
import threading

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
