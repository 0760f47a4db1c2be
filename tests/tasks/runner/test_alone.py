"""`tasks.runner.alone.AloneProcesses` with real child processes
(`tests.tasks.runner.alone_child`)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tasks.runner.alone import AloneProcesses, ProcessDied

CHILD = [sys.executable, "-m", "tests.tasks.runner.alone_child"]


@pytest.fixture
async def pool() -> AsyncIterator[AloneProcesses]:
    processes = AloneProcesses(CHILD, size=2)
    yield processes
    await processes.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_job_is_answered_and_its_child_kept_for_the_next(pool: AloneProcesses):
    first = await pool.run({"do": "echo", "n": 1}, timeout=30)
    second = await pool.run({"do": "echo", "n": 2}, timeout=30)
    assert first["echo"] == {"do": "echo", "n": 1}
    assert second["echo"]["n"] == 2
    assert first["pid"] == second["pid"], "one child ran both, one after the other"
    assert pool.started == 1


async def test_what_a_job_prints_goes_to_stderr_not_into_the_protocol(pool: AloneProcesses):
    reply = await pool.run({"do": "print"}, timeout=30)
    assert reply["echo"] == {"do": "print"}
    assert (await pool.run({"do": "echo"}, timeout=30))["pid"] == reply["pid"]


async def test_a_child_that_dies_running_a_job_says_how_and_is_replaced(pool: AloneProcesses):
    with pytest.raises(ProcessDied) as died:
        await pool.run({"do": "exit", "code": 3}, timeout=30)
    assert died.value.returncode == 3
    assert str(died.value) == "the process running the turn alone died (exit 3)"
    assert pool.children == []
    reply = await pool.run({"do": "echo"}, timeout=30)
    assert pool.started == 2
    assert alive(reply["pid"])


async def test_a_child_killed_by_a_signal_is_named_by_it(pool: AloneProcesses):
    with pytest.raises(ProcessDied) as died:
        await pool.run({"do": "signal", "signal": signal.SIGKILL}, timeout=30)
    assert died.value.how == "signal 9 (SIGKILL)"


async def test_a_child_with_no_answer_in_time_is_killed(pool: AloneProcesses):
    pid = (await pool.run({"do": "echo"}, timeout=30))["pid"]
    with pytest.raises(ProcessDied) as died:
        await pool.run({"do": "sleep", "seconds": 30}, timeout=0.5)
    assert died.value.how == "no answer in time"
    assert not alive(pid)


async def test_no_more_children_run_than_its_size(pool: AloneProcesses):
    replies = await asyncio.gather(
        *(pool.run({"do": "sleep", "seconds": 0.3}, timeout=30) for _ in range(6))
    )
    assert len({r["pid"] for r in replies}) == 2
    assert pool.started == 2


async def test_a_child_that_retires_is_stopped_and_not_used_again(pool: AloneProcesses):
    retired = await pool.run({"do": "retire"}, timeout=30)
    assert retired["retiring"] is True
    assert not alive(retired["pid"])
    assert (await pool.run({"do": "echo"}, timeout=30))["pid"] != retired["pid"]


async def test_idle_children_are_stopped_and_close_stops_the_rest():
    pool = AloneProcesses(CHILD, size=2, idle=0.3)
    try:
        await pool.run({"do": "echo"}, timeout=30)
        (idle,) = pool._free
        await asyncio.wait_for(idle.process.wait(), 5)  # an idle child is stopped
        again = (await pool.run({"do": "echo"}, timeout=30))["pid"]
    finally:
        await pool.close()
    assert not alive(again)


async def test_a_child_whose_parent_goes_away_ends_at_once(pool: AloneProcesses, tmp_path: Path):
    # Given a child running a job (it opens the FIFO `started` once it has it)
    await pool.run({"do": "echo"}, timeout=30)
    (child,) = pool._free
    started = tmp_path / "started"
    os.mkfifo(started)
    job = asyncio.ensure_future(
        pool.run({"do": "sleep", "seconds": 30, "started": str(started)}, timeout=60)
    )
    await asyncio.wait_for(asyncio.to_thread(lambda: open(started).close()), 30)

    # When its stdin closes, as it does with its parent, the job is abandoned and it ends
    assert child.process.stdin is not None
    child.process.stdin.close()
    assert await asyncio.wait_for(child.process.wait(), 5) == 0
    with pytest.raises(ProcessDied):
        await job
