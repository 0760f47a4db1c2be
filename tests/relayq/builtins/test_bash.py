"""The bash builtin: exit codes, combined output, a small environment, and no leftovers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from relayq import ToolContext, ToolkitError, ToolResult
from relayq.builtins import BASH_ENV_NAMES, BuiltinsConfig, builtin_tools


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


# -- the environment: an allow-list, extendable per agent --------------------


async def test_a_secret_of_the_worker_is_not_visible(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-worker-secret")
    monkeypatch.setenv("RELAYQ_TEST_SECRET", "hunter2")

    out = await _bash(tmp_path, {"command": "env; echo ${OPENAI_API_KEY-unset}"})

    assert not out.is_error
    assert "sk-worker-secret" not in out.output
    assert "hunter2" not in out.output
    assert out.output.endswith("unset\n")


async def test_only_allow_listed_variables_are_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("LC_TIME", "C")
    monkeypatch.setenv("TZ", "UTC")

    out = await _bash(tmp_path, {"command": "env -0"})

    names = {item.split("=", 1)[0] for item in out.output.split("\0") if item}
    assert {"LANG", "LC_TIME", "TZ", "PATH"} <= names
    # bash adds PWD, SHLVL and _ itself.
    assert names - {"PWD", "SHLVL", "_"} <= BASH_ENV_NAMES | {"LC_TIME", "LC_CTYPE", "LC_ALL"}


async def test_an_allowed_variable_keeps_the_workers_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANG", "C.UTF-8")

    out = await _bash(tmp_path, {"command": "echo $LANG"})

    assert out.output == "C.UTF-8\n"


async def test_an_agent_can_pass_more_variables_and_set_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYQ_TEST_TOKEN", "for-this-agent")
    monkeypatch.setenv("RELAYQ_TEST_SECRET", "hunter2")
    config = BuiltinsConfig(
        enabled=frozenset({"bash"}),
        bash_pass_env=frozenset({"RELAYQ_TEST_TOKEN"}),
        bash_env={"RELAYQ_FIXED": "fixed value", "LANG": "C"},
    )

    out = await _bash(
        tmp_path,
        {"command": 'echo "$RELAYQ_TEST_TOKEN|$RELAYQ_FIXED|$LANG|${RELAYQ_TEST_SECRET-unset}"'},
        config,
    )

    assert out.output == "for-this-agent|fixed value|C|unset\n"


def test_an_invalid_variable_name_is_a_toolkit_error() -> None:
    with pytest.raises(ToolkitError, match="invalid environment variable name"):
        BuiltinsConfig(bash_env={"A=B": "x"})


async def test_a_nul_byte_in_the_command_is_an_error_result(tmp_path: Path) -> None:
    out = await _bash(tmp_path, {"command": "echo a\0b"})

    assert out.is_error
    assert "NUL" in out.output


# -- nothing the command started outlives the call ---------------------------

# Each writes its pid to a file and then waits; the command waits for the files.
SETSID = "setsid sh -c 'echo $$ > setsid.pid; exec sleep 300' &"
DAEMON = "( setsid sh -c 'echo $$ > daemon.pid; exec sleep 300' & ) &"
WAIT_FOR_PIDS = "while [ ! -s setsid.pid ] || [ ! -s daemon.pid ]; do sleep 0.01; done"


async def test_setsid_and_double_forked_daemons_die_when_the_command_exits(
    tmp_path: Path,
) -> None:
    out = await _bash(tmp_path, {"command": f"{SETSID} {DAEMON} {WAIT_FOR_PIDS}; echo done"})

    assert out.output == "done\n"
    setsid, daemon = _pid_in(tmp_path / "setsid.pid"), _pid_in(tmp_path / "daemon.pid")
    assert setsid is not None
    assert daemon is not None
    # Killed and reaped before the call returned: no waiting here.
    assert not _alive(setsid), "the setsid process outlived the call"
    assert not _alive(daemon), "the double-forked daemon outlived the call"


async def test_setsid_and_double_forked_daemons_die_on_timeout(tmp_path: Path) -> None:
    command = f"{SETSID} {DAEMON} {WAIT_FOR_PIDS}; sleep 300"

    out = await _bash(tmp_path, {"command": command, "timeout_seconds": 2})

    assert out.output.startswith("timed out after 2 s")
    for name in ("setsid.pid", "daemon.pid"):
        pid = _pid_in(tmp_path / name)
        assert pid is not None
        assert not _alive(pid), f"{name} outlived the timeout"


async def test_setsid_daemons_die_when_the_call_is_cancelled(tmp_path: Path) -> None:
    (tool,) = builtin_tools(BuiltinsConfig.only("bash"))
    command = f"{SETSID} {DAEMON} {WAIT_FOR_PIDS}; sleep 300"
    call = asyncio.create_task(tool.invoke({"command": command}, _ctx(tmp_path)))
    setsid = await _read_pid(tmp_path / "setsid.pid")
    daemon = await _read_pid(tmp_path / "daemon.pid")

    call.cancel()
    await asyncio.gather(call, return_exceptions=True)

    assert not _alive(setsid)
    assert not _alive(daemon)


async def test_the_exit_code_passes_through_the_supervisor(tmp_path: Path) -> None:
    out = await _bash(tmp_path, {"command": "sleep 300 & exit 7"})

    assert out.output == "exit code 7\n"


REPO = Path(__file__).resolve().parents[3]
WORKER = """
import asyncio, sys
from pathlib import Path
from relayq import ToolContext
from relayq.builtins import BuiltinsConfig, builtin_tools

async def main() -> None:
    (tool,) = builtin_tools(BuiltinsConfig.only("bash"))
    ctx = ToolContext(run_id="r", call_id="c", tool_name="bash", base_dir=Path(sys.argv[1]))
    await tool.invoke({"command": sys.argv[2]}, ctx)

asyncio.run(main())
"""


async def test_daemons_die_when_the_worker_itself_is_killed(tmp_path: Path) -> None:
    # Given a worker process in the middle of a bash call that started daemons
    command = f"{SETSID} {DAEMON} {WAIT_FOR_PIDS}; sleep 300"
    worker = await asyncio.create_subprocess_exec(
        sys.executable, "-c", WORKER, str(tmp_path), command, cwd=REPO
    )
    pids: list[int] = []
    try:
        pids = [
            await _read_pid(tmp_path / "setsid.pid", within=15),
            await _read_pid(tmp_path / "daemon.pid", within=15),
        ]

        # When the worker is killed outright, with no chance to clean up
        worker.kill()
        await worker.wait()

        # Then the supervisor, told by the kernel, kills them all the same
        for pid in pids:
            assert await _wait_until_dead(pid), f"{pid} outlived the worker"
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
