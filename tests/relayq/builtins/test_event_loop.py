"""No builtin holds up the event loop: every other turn on the worker runs on it.

The tick tests are correctness checks, not benchmarks: a coroutine that should
wake every 10 ms must never wait anywhere near half a second.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from relayq import ToolResult
from relayq.builtins import BuiltinsConfig

from .calls import call as _call

MAX_GAP = 0.5


async def _longest_gap_while(work: asyncio.Task[ToolResult]) -> float:
    """The longest a 10 ms ticker on this loop had to wait while `work` ran."""
    gap = 0.0
    last = time.monotonic()
    while not work.done():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        gap = max(gap, now - last)
        last = now
    return gap


async def test_a_catastrophic_grep_neither_stalls_the_loop_nor_runs_past_its_deadline(
    tmp_path: Path,
) -> None:
    # Given lines on which these patterns backtrack for seconds (or ever) with `re`
    (tmp_path / "a.txt").write_text("a" * 25 + "b\n" + "a" * 40 + "b\n")
    config = BuiltinsConfig(enabled=frozenset({"grep"}), file_timeout=timedelta(seconds=1))

    for pattern in ["(a+)+$", "(a|a)+$"]:
        # When grep runs while another coroutine ticks on the same loop
        started = time.monotonic()
        work = asyncio.create_task(_call(tmp_path, "grep", {"pattern": pattern}, config))
        gap = await _longest_gap_while(work)
        out = work.result()

        # Then the loop kept running, and grep ended by its deadline
        assert gap < MAX_GAP, f"{pattern}: the event loop stalled for {gap:.2f} s"
        assert time.monotonic() - started < 5
        if out.is_error:
            assert "grep gave up after 1 s" in out.output
            assert "took too long to match" in out.output
        else:
            assert "No matches" in out.output
    assert out.is_error, "(a|a)+$ should have hit the deadline"


async def test_reading_a_huge_file_does_not_stall_the_loop(tmp_path: Path) -> None:
    line = b"x" * 99 + b"\n"
    with (tmp_path / "huge.txt").open("wb") as f:
        for _ in range(64):
            f.write(line * 10_000)  # 64 MB, 640,000 lines

    work = asyncio.create_task(
        _call(tmp_path, "read", {"path": "huge.txt", "offset": 639_999, "limit": 5})
    )
    gap = await _longest_gap_while(work)
    out = work.result()

    assert gap < MAX_GAP, f"the event loop stalled for {gap:.2f} s"
    assert out.output.startswith("639999\t" + "x" * 99 + "\n640000\t")
    assert not out.is_error


async def test_a_search_that_runs_too_long_gives_up_with_an_error(tmp_path: Path) -> None:
    for i in range(50):
        (tmp_path / f"d{i}").mkdir()
        (tmp_path / f"d{i}" / "f.txt").write_text("needle\n")
    config = BuiltinsConfig(
        enabled=frozenset({"glob", "grep"}), file_timeout=timedelta(microseconds=1)
    )

    glob = await _call(tmp_path, "glob", {"pattern": "**"}, config)
    grep = await _call(tmp_path, "grep", {"pattern": "needle"}, config)

    assert glob.is_error
    assert "glob gave up after" in glob.output
    assert grep.is_error
    assert "grep gave up after" in grep.output


# -- file work happens off the loop's thread ---------------------------------


@pytest.fixture
def os_calls(monkeypatch: pytest.MonkeyPatch) -> set[int]:
    """The threads that called into the file system while a test ran."""
    threads: set[int] = set()

    def spy(fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            threads.add(threading.get_ident())
            return fn(*args, **kwargs)

        return call

    for name in ("open", "read", "write", "scandir", "stat", "readlink", "mkdir", "unlink"):
        monkeypatch.setattr(os, name, spy(getattr(os, name)))
    return threads


def _patch(*lines: str) -> str:
    return "\n".join(["*** Begin Patch", *lines, "*** End Patch"])


CALLS: dict[str, dict[str, Any]] = {
    "read": {"path": "a.txt"},
    "write": {"path": "new/b.txt", "content": "b\n"},
    "edit": {"path": "a.txt", "old_string": "alpha", "new_string": "beta"},
    "grep": {"pattern": "alpha"},
    "glob": {"pattern": "**"},
    "apply_patch": {"patch": _patch("*** Update File: a.txt", "@@", "-alpha", "+gamma")},
}


@pytest.mark.parametrize("name", list(CALLS))
async def test_file_tools_touch_the_file_system_only_off_the_loop_thread(
    tmp_path: Path, os_calls: set[int], name: str
) -> None:
    (tmp_path / "a.txt").write_text("alpha\n")
    os_calls.clear()

    out = await _call(tmp_path, name, CALLS[name])

    assert not out.is_error, out.output
    assert os_calls, "the spy saw no file system call"
    assert threading.get_ident() not in os_calls
