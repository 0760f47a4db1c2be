"""Issue 51: a worker's liveness is its event loop turning (`tasks.runner.loopwatch`)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from tasks.runner.loopwatch import EXIT_STALLED, LoopWatch

from ...waiting import until

SECRET = "prompt-text-never-logged-7f3a"


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    thread = threading.Thread(target=running.run_forever, daemon=True)
    thread.start()
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(timeout=5)
    running.close()


def stalls_counted() -> float:
    return REGISTRY.get_sample_value("relayq_loop_stalls_total") or 0.0


def stall_lengths() -> float:
    return REGISTRY.get_sample_value("relayq_loop_stall_seconds_count") or 0.0


def hold_the_loop_in_a_tool(watch: LoopWatch, seconds: float) -> None:
    """Blocks the loop's thread in a synchronous sleep, as a blocking call inside an
    async tool would, with a prompt in its locals."""
    prompt = SECRET  # noqa: F841  (a local the stall's log must never show)
    time.sleep(seconds)


async def a_turn(watch: LoopWatch, seconds: float) -> None:
    """A turn whose tool runs in a task of its own, as a turn's calls do."""

    async def a_call() -> None:
        with watch.doing("tool pay (call c1)"):
            hold_the_loop_in_a_tool(watch, seconds)

    with watch.doing("a turn of run run_1 (agent payer)"):
        await asyncio.gather(a_call())


def test_a_loop_held_past_the_bound_is_stalled_named_counted_and_ends_the_process(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
):
    # Given a watch that calls the loop stalled after 0.3 s and ends the process 1.5 s in
    exits: list[int] = []
    watch = LoopWatch(loop, stall=0.3, exit_after=1.5, exit=exits.append)
    counted, lengths = stalls_counted(), stall_lengths()
    caplog.set_level(logging.INFO, logger="tasks.runner.loopwatch")
    watch.start()
    try:
        until(lambda: watch._loop_thread is not None, what="the loop's first tick", timeout=10)
        assert not watch.stalled

        # When a tool holds the loop for 2.5 s
        future = asyncio.run_coroutine_threadsafe(a_turn(watch, 2.5), loop)

        # Then the loop is stalled within its bound, and counted at once
        until(lambda: watch.stalled, what="the stall", timeout=10)
        assert stalls_counted() == counted + 1
        # ... the log names the tool, the turn and the blocking function, never a value
        declared = next(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
        assert "tool pay (call c1), in a turn of run run_1 (agent payer)" in declared
        assert "in hold_the_loop_in_a_tool" in declared
        assert SECRET not in caplog.text
        # ... and past the second bound the process ends, with its length observed
        until(lambda: exits, what="the exit", timeout=10)
        # ... once, though the loop stays held for a second more (a test's exit returns)
        future.result(timeout=5)
        assert exits == [EXIT_STALLED]
        assert stall_lengths() == lengths + 1
        final = [r for r in caplog.records if r.levelno == logging.CRITICAL]
        assert len(final) == 1
        assert "in hold_the_loop_in_a_tool" in final[0].getMessage()
    finally:
        watch.stop()


def test_a_loop_that_turns_again_before_the_exit_bound_is_well_again(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
):
    # Given a watch that calls the loop stalled after 0.2 s and ends the process after 30 s
    exits: list[int] = []
    watch = LoopWatch(loop, stall=0.2, exit_after=30, exit=exits.append)
    lengths = stall_lengths()
    watch.start()
    try:
        until(lambda: watch._loop_thread is not None, what="the loop's first tick", timeout=10)

        # When a tool holds the loop for 1 s, then lets go
        future = asyncio.run_coroutine_threadsafe(a_turn(watch, 1.0), loop)
        until(lambda: watch.stalled, what="the stall", timeout=10)
        future.result(timeout=5)

        # Then it is well again, its stall's length observed, and nothing ended
        until(lambda: not watch.stalled, what="the loop to turn again", timeout=10)
        assert stall_lengths() == lengths + 1
        assert "turns again, after" in caplog.text
        assert exits == []
        # ... and a loop that only waits (an await, however long) never stalls
        asyncio.run_coroutine_threadsafe(asyncio.sleep(1.0), loop).result(timeout=5)
        assert watch.stalls == 1
    finally:
        watch.stop()


def test_a_task_that_says_nothing_is_named_by_its_task(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
):
    watch = LoopWatch(loop, stall=0.2, exit_after=30, exit=lambda code: None)
    watch.start()
    try:

        async def quiet() -> None:
            time.sleep(0.8)  # noqa: ASYNC251  (the point)

        def schedule() -> None:
            loop.create_task(quiet(), name="the-quiet-one")

        loop.call_soon_threadsafe(schedule)
        until(lambda: watch.stalled, what="the stall", timeout=10)
        assert "task the-quiet-one" in caplog.text
        until(lambda: not watch.stalled, what="the loop to turn again", timeout=10)
    finally:
        watch.stop()


PAUSED = textwrap.dedent(
    """
    import asyncio, sys, threading, time
    from tasks.runner.loopwatch import LoopWatch

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    watch = LoopWatch(loop, stall=0.3, exit_after=1.0, exit=lambda code: print("exit", code))
    watch.start()
    print("ready", flush=True)
    sys.stdin.readline()  # the parent stops this process, starts it again, then writes
    time.sleep(1.0)
    print("stalls", watch.stalls, flush=True)
    """
)


def test_a_whole_process_stopped_and_started_again_is_no_stall_of_its_loop():
    # Given a process whose loop is watched (stalled after 0.3 s, ended after 1 s)
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        assert proc.stdout.readline().strip() == "ready"

        # When the whole process is stopped for 2 s (SIGSTOP: a debugger, a suspended
        # host), then goes on
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(2.0)
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate("go\n", timeout=20)

        # Then its loop was not blamed for the time nobody ran: no stall, no exit
        assert out.split() == ["stalls", "0"], out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
