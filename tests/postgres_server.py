"""A PostgreSQL of a test's own, which the test may crash and start again: a store outage.

Never the machine's shared server: a fresh cluster (the machine's `initdb`)
in a folder of its own, served by `pg_ctl` on a free port of 127.0.0.1, with
trust authentication and no fsync (see `start`). Run as root (as on CI), the cluster
belongs to the `postgres` user, since PostgreSQL refuses to run as root.

    with PrivatePostgres() as pg:
        env["RELAYQ_DATABASE_URL"] = pg.url
        ...
        pg.crash()   # `pg_ctl stop -m immediate`: connections drop, in-flight work is lost
        pg.start()   # the same cluster and data, back on the same port
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.ports import free_port

__all__ = ["PrivatePostgres", "postgres_binaries"]


def postgres_binaries() -> Path | None:
    """The folder holding `initdb` and `pg_ctl`, if this machine has them."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(folder) / "initdb").exists():
            return Path(folder)
    return None


class PrivatePostgres:
    """A PostgreSQL cluster of its own on 127.0.0.1:<free port>."""

    def __init__(self, *, options: str = "") -> None:
        """`options`: more `-c name=value` settings for the server, after the defaults."""
        binaries = postgres_binaries()
        if binaries is None:
            raise RuntimeError("no initdb and pg_ctl on this machine")
        self.bin = binaries
        self.port = free_port()
        # Not under pytest's tmp_path: as root that is closed to the `postgres` user.
        self.folder = Path(tempfile.mkdtemp(prefix="relayq-pg-"))
        self.data = self.folder / "data"
        self.logfile = self.folder / "postgres.log"
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            os.chown(self.folder, user.pw_uid, user.pw_gid)
            self._as = {"user": user.pw_uid, "group": user.pw_gid}
        self._initialised = False
        self.options = options

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 60) -> None:
        done = subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.folder,
            **self._as,
        )
        if done.returncode != 0:
            log = self.logfile.read_text() if self.logfile.exists() else ""
            raise RuntimeError(f"{args[0]} failed: {done.stdout}{done.stderr}\n{log[-2000:]}")

    def start(self) -> PrivatePostgres:
        """Start the server (making the cluster the first time) and wait until it answers."""
        if not self._initialised:
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                "-E", "UTF8", "--no-sync", "--no-instructions",
            )  # fmt: skip
            self._initialised = True
        # No fsync: a crash of the server's processes leaves what they wrote in the
        # kernel's cache. A commit is still acknowledged only once its WAL is written
        # (synchronous_commit on): off, a crash would lose commits a caller was told of.
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
            f"-c fsync=off -c full_page_writes=off {self.options}"
        )
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.logfile),
                  "-w", "-t", "60", "start")  # fmt: skip
        return self

    def crash(self) -> None:
        """Stop at once, as a crash would: every connection drops, nothing is shut down cleanly."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        if self._initialised and (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def remove(self) -> None:
        """Stop, and delete the cluster's folder."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        try:
            return self.start()
        except BaseException:
            self.remove()  # its folder, and a server that started but did not answer
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()
