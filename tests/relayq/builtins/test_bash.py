"""The bash builtin: exit codes, combined output, timeouts that kill the whole group."""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from relayq._tools import ToolContext
from relayq._types import ToolResult
from relayq.builtins import BuiltinsConfig, builtin_tools


def _ctx(base: Path) -> ToolContext:
    return ToolContext(run_id="run_t", call_id="c1", tool_name="bash", base_dir=base)


async def _bash(
    base: Path, args: dict[str, Any], config: BuiltinsConfig | None = None
) -> ToolResult:
    (tool,) = builtin_tools(config or BuiltinsConfig.only("bash"))
    out = await tool.invoke(args, _ctx(base))
    assert isinstance(out, ToolResult)
    return out


def _alive(pid: int) -> bool:
    """Whether `pid` still runs; a zombie waiting for an init that never reaps counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _wait_until_dead(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


def _pid_in(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


async def _read_pid(path: Path, within: float = 5.0) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        pid = _pid_in(path)
        if pid is not None:
            return pid
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def _real(path: Path) -> str:
    return str(path.resolve())


async def test_a_zero_exit_returns_the_output(tmp_path: Path) -> None:
    out = await _bash(tmp_path, {"command": "echo hello"})

    assert out == ToolResult(output="hello\n")


async def test_a_command_without_output_says_so(tmp_path: Path) -> None:
    out = await _bash(tmp_path, {"command": "true"})

    assert out == ToolResult(output="(no output)")


async def test_a_non_zero_exit_is_an_error_carrying_the_code(tmp_path: Path) -> None:
    out = await _bash(tmp_path, {"command": "echo failing; exit 3"})

    assert out.is_error
    assert out.output == "exit code 3\nfailing\n"


async def test_stdout_and_stderr_are_interleaved_in_one_stream(tmp_path: Path) -> None:
    out = await _bash(tmp_path, {"command": "echo one; echo two >&2; echo three; echo four >&2"})

    assert out.output == "one\ntwo\nthree\nfour\n"


async def test_the_command_runs_in_the_base_directory(tmp_path: Path) -> None:
    out = await _bash(tmp_path, {"command": "pwd"})

    assert out.output.strip() == _real(tmp_path)


async def test_the_base_directory_is_read_at_call_time(tmp_path: Path) -> None:
    (tool,) = builtin_tools(BuiltinsConfig.only("bash"))
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()

    a = await tool.invoke({"command": "pwd"}, _ctx(first))
    b = await tool.invoke({"command": "pwd"}, _ctx(second))

    assert isinstance(a, ToolResult)
    assert isinstance(b, ToolResult)
    assert a.output.strip() == _real(first)
    assert b.output.strip() == _real(second)


async def test_stdin_is_empty(tmp_path: Path) -> None:
    # `cat` would wait for input forever if stdin were inherited.
    out = await _bash(tmp_path, {"command": "cat | wc -c", "timeout_seconds": 10})

    assert not out.is_error
    assert out.output.strip() == "0"


async def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    command = "sleep 100 & echo $! > child.pid; echo started; sleep 100"

    out = await _bash(tmp_path, {"command": command, "timeout_seconds": 1})

    assert out.is_error
    assert out.output.startswith("timed out after 1 s")
    assert "started" in out.output  # the output so far
    child = await _read_pid(tmp_path / "child.pid")
    assert await _wait_until_dead(child), "the background sleep survived the timeout"


async def test_the_configured_timeout_applies_without_the_argument(tmp_path: Path) -> None:
    config = BuiltinsConfig(enabled=frozenset({"bash"}), bash_timeout=timedelta(seconds=1))
    started = time.monotonic()

    out = await _bash(tmp_path, {"command": "sleep 30"}, config)

    assert out.is_error
    assert "timed out after 1 s" in out.output
    assert time.monotonic() - started < 10


async def test_the_argument_cannot_lengthen_the_configured_timeout(tmp_path: Path) -> None:
    config = BuiltinsConfig(enabled=frozenset({"bash"}), bash_timeout=timedelta(seconds=1))

    out = await _bash(tmp_path, {"command": "sleep 30", "timeout_seconds": 25}, config)

    assert out.is_error
    assert "timed out after 1 s" in out.output


async def test_background_jobs_do_not_outlive_the_command(tmp_path: Path) -> None:
    out = await _bash(tmp_path, {"command": "sleep 100 & echo $!"})

    assert not out.is_error
    assert await _wait_until_dead(int(out.output))


async def test_cancelling_the_call_kills_the_command(tmp_path: Path) -> None:
    (tool,) = builtin_tools(BuiltinsConfig.only("bash"))
    call = asyncio.create_task(
        tool.invoke({"command": "sleep 100 & echo $! > child.pid; sleep 100"}, _ctx(tmp_path))
    )
    child = await _read_pid(tmp_path / "child.pid")

    call.cancel()
    await asyncio.gather(call, return_exceptions=True)

    assert await _wait_until_dead(child)


async def test_a_command_killed_by_a_signal_is_an_error(tmp_path: Path) -> None:
    out = await _bash(tmp_path, {"command": "kill -9 $$"})

    assert out.is_error
    assert out.output.startswith("killed by signal 9")


async def test_long_output_is_cut_with_a_note(tmp_path: Path) -> None:
    config = BuiltinsConfig(enabled=frozenset({"bash"}), max_output_chars=100)

    out = await _bash(tmp_path, {"command": "printf 'a%.0s' $(seq 1000)"}, config)

    assert out.output.startswith("a" * 100 + "\n")
    assert "900 of 1000 characters not shown" in out.output


async def test_a_bad_timeout_is_an_error_result(tmp_path: Path) -> None:
    zero = await _bash(tmp_path, {"command": "true", "timeout_seconds": 0})
    text = await _bash(tmp_path, {"command": "true", "timeout_seconds": "soon"})

    assert zero.is_error
    assert "timeout_seconds" in zero.output
    assert text.is_error


async def test_a_missing_command_is_an_error_result(tmp_path: Path) -> None:
    out = await _bash(tmp_path, {})

    assert out.is_error
    assert "command" in out.output


def test_the_test_helper_sees_this_process_alive() -> None:
    assert _alive(os.getpid())
