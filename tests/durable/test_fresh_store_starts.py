"""Processes started together on a fresh store all come up (issue 21, item 4).

`relayq worker`, `relayq api` and `relayq beat` start side by side on a store no process
has opened yet, as compose starts its services: the first to open it makes the schema,
the others wait for it, then go on. Twenty times on a new SQLite file, twenty on a new
PostgreSQL database; each time every process must be up and ready before all are stopped.

What killed one on SQLite: the first connection to a new file makes it a WAL database,
and SQLite waits for no lock there; a second process doing the same at that moment
failed at once ("database is locked"). Twenty tries meet that moment only by chance;
the last test makes it last, holding the new file's lock while the processes start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psycopg
import pytest

from tests import forkserver
from tests.ports import free_port
from tests.waiting import until

from .conftest import PG_ADMIN, ROOT, Broker

if TYPE_CHECKING:
    from tests.conftest import Parts

START_EARLY = True  # tests/conftest.py: its tests take long, so a lane takes them first

TRIES = 20
READY_TIMEOUT = 60.0
"""Seconds each try's processes have to be ready: ample on a loaded machine; a process
that exits fails the try at once."""


@dataclass
class Started:
    """One process of a try: its name, its process, its log, and how it tells it is ready."""

    name: str
    proc: forkserver.Proc
    log: Path
    ready_line: bytes | None = None
    """A line its log holds once it is ready; None: ask the API's `/readyz`."""
    url: str = ""

    def ready(self, http: httpx.Client) -> bool:
        if self.ready_line is not None:
            return self.ready_line in self.log.read_bytes()
        try:
            return http.get(f"{self.url}/readyz").status_code == 200
        except httpx.HTTPError:
            return False

    def says(self) -> str:
        return f"--- {self.name} (exit {self.proc.poll()}):\n{self.log.read_text()[-2000:]}"


@contextlib.contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """A database no process has opened, named for this try alone (lanes never share one)."""
    name = f"relayq_test_fresh_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=2) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=2) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_kind(request: pytest.FixtureRequest, machine_parts: Parts) -> str:
    if request.param == "postgresql":
        try:
            psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=2).close()
        except psycopg.OperationalError:
            machine_parts.missing(
                "postgres",
                f"no PostgreSQL server at {PG_ADMIN} (start one, or set RELAYQ_TEST_POSTGRES)",
            )
    return str(request.param)


def start_together(home: Path, env: dict[str, str]) -> list[Started]:
    """`relayq worker`, `relayq api` and `relayq beat`, forked one straight after another."""
    port = free_port()
    commands = {
        "worker": ["worker", "-c", "1", "--", "--without-mingle", "--without-gossip",
                   "--without-heartbeat", "-n", f"fresh-{uuid.uuid4().hex[:6]}@%h"],
        "api": ["api", "--port", str(port)],
        "beat": ["beat"],
    }  # fmt: skip
    started = []
    for name, args in commands.items():
        log = home / f"{name}.log"
        with log.open("wb") as out:
            proc = forkserver.spawn(
                [sys.executable, "-m", "cli.main", *args],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        started.append(Started(name, proc, log))
    worker, api, beat = started
    worker.ready_line = b" ready."
    api.url = f"http://127.0.0.1:{port}"
    beat.ready_line = b"beat: Starting..."
    return started


def wait_until_ready(started: list[Started], attempt: str) -> None:
    """Return once each process is ready; fail the moment one exits, or at the deadline."""
    waiting = list(started)
    # One client for every poll: making one costs more than the poll.
    with httpx.Client(timeout=2, trust_env=False) as http:

        def all_ready() -> bool:
            nonlocal waiting
            gone = [s.says() for s in started if s.proc.poll() is not None]
            if gone:
                pytest.fail(f"{attempt}: a process exited:\n" + "\n".join(gone), pytrace=False)
            waiting = [s for s in waiting if not s.ready(http)]
            return not waiting

        until(
            all_ready,
            what=f"{attempt}: every process ready",
            timeout=READY_TIMEOUT,
            said=lambda: "\n".join(s.says() for s in waiting),
        )


def stop_all(started: list[Started]) -> None:
    """SIGKILL every process group at once: they and their store are thrown away."""
    for s in started:
        if s.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.proc.pid, signal.SIGKILL)
    for s in started:
        s.proc.wait()


def environment(home: Path, url: str, broker: Broker) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RELAYQ_")}
    return base | {
        "RELAYQ_HOME": str(home),
        "RELAYQ_DATABASE_URL": url,
        "RELAYQ_BROKER_URL": broker.url,
        "RELAYQ_KEY_PREFIX": broker.new_prefix(),
        "RELAYQ_AGENTS": "tests.durable.agents",
        "PYTHONUNBUFFERED": "1",
    }


def holds_open(started: Started, path: Path) -> bool:
    """Whether the process has the file open (its descriptors, as /proc lists them)."""
    fds = Path(f"/proc/{started.proc.pid}/fd")
    with contextlib.suppress(OSError):
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):
                if fd.readlink() == path:
                    return True
    return False


# Twenty tries of three processes each: over the suite's one-minute guard on a loaded machine.
@pytest.mark.timeout(240)
def test_a_worker_an_api_and_beat_started_together_on_a_fresh_store_all_come_up(
    store_kind: str, broker: Broker, tmp_path: Path
):
    for n in range(TRIES):
        # Given a store no process has opened yet (a new SQLite file, a new database)
        home = tmp_path / f"try-{n}"
        home.mkdir()
        with contextlib.ExitStack() as stack:
            if store_kind == "sqlite":
                url = f"sqlite:///{home / 'relayq.db'}"
            else:
                url = stack.enter_context(fresh_postgres_database())
            env = environment(home, url, broker)

            # When a worker, the API and beat start on it at once
            started = start_together(home, env)
            stack.callback(stop_all, started)

            # Then each comes up, ready, and none has died of another making the schema
            attempt = f"try {n + 1} of {TRIES} on {store_kind}"
            wait_until_ready(started, attempt)
            down = [s.says() for s in started if s.proc.poll() is not None]
            assert not down, f"{attempt}: " + "\n".join(down)
            for s in started:
                assert b"Traceback" not in s.log.read_bytes(), f"{attempt}: {s.says()}"


def test_processes_starting_on_a_new_sqlite_file_another_holds_wait_for_it_then_come_up(
    broker: Broker, tmp_path: Path
):
    # Given a new SQLite file whose lock another process holds, as the first process to
    # open a store does while it makes the file a WAL database and the schema in it
    path = tmp_path / "relayq.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    with contextlib.ExitStack() as stack:
        stack.callback(holder.close)

        # When a worker, the API and beat start on it
        started = start_together(tmp_path, environment(tmp_path, f"sqlite:///{path}", broker))
        stack.callback(stop_all, started)

        # and the two that open the store at start have opened it
        worker, api, _beat = started

        def opened() -> bool:
            gone = [s.says() for s in started if s.proc.poll() is not None]
            if gone:
                pytest.fail("not waiting for the store:\n" + "\n".join(gone), pytrace=False)
            return holds_open(worker, path) and holds_open(api, path)

        until(opened, what="the worker and the API to open the store", timeout=READY_TIMEOUT)
        holder.execute("ROLLBACK")

        # Then each waited for the lock, went on once it was free, and is up and ready
        wait_until_ready(started, "after the lock was freed")
