"""The bash builtin: one shell command, a small environment, a hard timeout.

The command runs under `_reaper.py`, a supervisor that kills every process the
command started (setsid and double-forked daemons included, on Linux) before
the call returns. It sees only an allow-list of the worker's environment
(`BASH_ENV_NAMES`, `LC_*`, and what the agent's config adds), so provider keys
and other secrets of the worker stay out of the model's reach.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relayq._tools import Tool, ToolContext
from relayq._types import ToolResult
from relayq.builtins._common import (
    OutputSink,
    ToolFailure,
    async_builtin,
    opt_seconds,
    req_str,
)
from relayq.builtins._config import BASH_ENV_NAMES, BuiltinsConfig
from relayq.builtins._paths import base_of

__all__ = ["bash_tool", "command_env"]

_CHUNK = 64 * 1024
_SUPERVISOR = str(Path(__file__).with_name("_reaper.py"))
# The supervisor kills everything once the command ends, which closes the pipe;
# should something still hold it, stop reading after this long.
_DRAIN_SECONDS = 0.5
# How long the supervisor may take to kill and reap after SIGTERM before it is
# killed itself (its process group with it).
_STOP_SECONDS = 5.0


@dataclass(frozen=True)
class _Finished:
    output: str
    returncode: int | None
    timed_out: bool


def bash_tool(config: BuiltinsConfig) -> Tool:
    limit = config.bash_timeout.total_seconds()
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "description": "The command line, run with `/bin/bash -c` in the working "
                "directory. Standard input is empty.",
            },
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "description": "Kill the command after this many seconds. Default and "
                f"maximum: {limit:g}.",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }

    async def bash(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        command = req_str(args, "command")
        if "\0" in command:
            raise ToolFailure("the command must not contain NUL bytes")
        timeout = opt_seconds(args, "timeout_seconds", limit)
        cwd = str(await asyncio.to_thread(base_of, ctx))
        outcome = await _run(command, cwd, command_env(config), timeout, config.max_output_chars)
        return _result(outcome, timeout)

    return async_builtin(
        "bash",
        "Run one shell command with bash in the working directory and return its "
        "standard output and standard error, interleaved as a terminal shows them. "
        "A non-zero exit code makes the result an error that starts with the code. "
        "Every process the command started is killed when it times out or when the "
        "command exits, so background jobs (`cmd &`) and daemons do not outlive the call. "
        "Only a few environment variables (PATH, HOME, locale and the like) are set.",
        schema,
        bash,
    )


def _result(outcome: _Finished, timeout: float) -> ToolResult:
    if outcome.timed_out:
        return ToolResult.error(
            f"timed out after {timeout:g} s; the command and its child processes were "
            f"killed. Output so far:\n{outcome.output}"
        )
    if outcome.returncode == 0:
        return ToolResult(output=outcome.output or "(no output)")
    code = outcome.returncode
    if code is not None and code < 0:
        return ToolResult.error(f"killed by signal {-code}\n{outcome.output}")
    return ToolResult.error(f"exit code {code}\n{outcome.output}")


def command_env(config: BuiltinsConfig) -> dict[str, str]:
    """The environment a command gets: the allow-listed part of the worker's, plus the config's."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name in BASH_ENV_NAMES or name.startswith("LC_") or name in config.bash_pass_env
    }
    env.setdefault("PATH", os.defpath)
    env.update(config.bash_env)
    return env


async def _run(
    command: str, cwd: str, env: dict[str, str], seconds: float, max_chars: int
) -> _Finished:
    # One pipe serves as both stdout and stderr so their writes interleave exactly
    # as a terminal would show them; reading it ourselves lets us stop reading
    # should something still hold the other end.
    read_fd, write_fd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            _SUPERVISOR,
            command,
            str(os.getpid()),
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=write_fd,
            stderr=write_fd,
            start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    sink = OutputSink(max_chars)
    reader = asyncio.create_task(_pump(read_fd, sink))
    timed_out = False
    try:
        await _send_env(proc, env)
        await asyncio.wait_for(proc.wait(), seconds)
    except TimeoutError:
        timed_out = True
    finally:
        # Finished, timed out or cancelled, nothing the command started outlives the
        # call: the next call may run on another worker, and leftovers would leak.
        await _stop(proc)
        await _drain(reader)
    return _Finished(output=sink.text(), returncode=proc.returncode, timed_out=timed_out)


async def _send_env(proc: asyncio.subprocess.Process, env: dict[str, str]) -> None:
    # On stdin rather than in the supervisor's environment, which Python's startup
    # may change (LC_CTYPE coercion), and rather than in argv, which `ps` shows.
    data = "".join(f"{name}={value}\0" for name, value in env.items())
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data.encode("utf-8", "surrogateescape"))
        await proc.stdin.drain()
        proc.stdin.close()


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Have the supervisor kill everything; kill its group should it not manage in time."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), _STOP_SECONDS)
    except TimeoutError:
        _kill_group(proc.pid)
        await proc.wait()


def _kill_group(pgid: int) -> None:
    # start_new_session made the supervisor the leader of its own group.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _pump(fd: int, sink: OutputSink) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=_CHUNK)
    pipe = os.fdopen(fd, "rb", buffering=0)
    try:
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
    except BaseException:
        pipe.close()
        raise
    try:
        while chunk := await reader.read(_CHUNK):
            sink.feed(chunk)
    finally:
        transport.close()  # closes the pipe too


async def _drain(reader: asyncio.Task[None]) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(reader), _DRAIN_SECONDS)
    except TimeoutError:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
