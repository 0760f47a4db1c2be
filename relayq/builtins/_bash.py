"""The bash builtin: one shell command, its own process group, a hard timeout."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Any

from relayq._tools import Tool, ToolContext
from relayq._types import ToolResult
from relayq.builtins._common import OutputSink, async_builtin, opt_seconds, req_str
from relayq.builtins._config import BuiltinsConfig
from relayq.builtins._paths import base_of

__all__ = ["bash_tool"]

_CHUNK = 64 * 1024
# Once the process group is killed the pipe closes at once, unless a child left
# the group (setsid) and still holds it; then stop reading after this long.
_DRAIN_SECONDS = 0.5


@dataclass(frozen=True)
class _Outcome:
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
        timeout = opt_seconds(args, "timeout_seconds", limit)
        outcome = await _run(command, str(base_of(ctx)), timeout, config.max_output_chars)
        return _result(outcome, timeout)

    return async_builtin(
        "bash",
        "Run one shell command with bash in the working directory and return its "
        "standard output and standard error, interleaved as a terminal shows them. "
        "A non-zero exit code makes the result an error that starts with the code. "
        "Every process the command started is killed when it times out or when the "
        "command exits, so background jobs (`cmd &`) do not outlive the call.",
        schema,
        bash,
    )


def _result(outcome: _Outcome, timeout: float) -> ToolResult:
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


async def _run(command: str, cwd: str, seconds: float, max_chars: int) -> _Outcome:
    # One pipe serves as both stdout and stderr so their writes interleave exactly
    # as a terminal would show them; reading it ourselves lets us close it while a
    # background child still holds the other end.
    read_fd, write_fd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            "/bin/bash",
            "-c",
            command,
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
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
        await asyncio.wait_for(proc.wait(), seconds)
    except TimeoutError:
        timed_out = True
    finally:
        # Finished, timed out or cancelled, nothing the command started outlives the
        # call: the next call may run on another worker, and leftovers would leak.
        _kill_group(proc.pid)
        if proc.returncode is None:
            await proc.wait()
        await _drain(reader)
    return _Outcome(output=sink.text(), returncode=proc.returncode, timed_out=timed_out)


def _kill_group(pgid: int) -> None:
    # start_new_session made the shell the leader of its own group, so its pid
    # names the group of every process it started, background ones included.
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
