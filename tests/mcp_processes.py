"""`tests.mcp_server` in a process of its own, which a test may kill and start again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.waiting import until

ROOT = Path(__file__).resolve().parent.parent


class MCPServerProcess:
    """`python -m tests.mcp_server http PORT`, started, killed (SIGKILL) and started again
    on the same port.

        server = MCPServerProcess(port).start(); server.kill(); server.start()
    """

    def __init__(self, port: int, **env: str) -> None:
        self.port = port
        self.env = {**os.environ, **env}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self, timeout: float = 30.0) -> MCPServerProcess:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.mcp_server", "http", str(self.port)],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError("the MCP server exited as it started")
            return _listening(self.port)

        try:
            until(up, what="the MCP server to listen", timeout=timeout)
        except BaseException:
            self.kill()
            raise
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def stdio_args() -> list[str]:
    """The command line of the stdio server, for `MCPServerStdio(sys.executable, args=...)`."""
    return ["-m", "tests.mcp_server", "stdio"]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
