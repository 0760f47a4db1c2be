"""Real parts for the durable tests: a Redis, a database, Celery workers in other processes,
and the API over real HTTP.

tests/durable holds only tests that run across processes: real worker processes, and the
brokers, stores and APIs they meet (the eager hosts' tests among them run on the session's
stores, `database_url`). A test that takes none of these parts (`durable`, `spare_workers`,
`broker`, `client`, `api`, ...) and starts no process of its own goes with the package it
tests instead: tests/relayq, tests/store, tests/tasks, tests/workers (the Celery
configuration, the asyncio pool, Flower), tests/api or tests/cli.

Redis: the machine's server (127.0.0.1:6379) when it answers, on the db
number of this xdist lane (tests.lanes) and under key prefixes of this session
only; else an embedded one of the lane's own.
Databases: a SQLite file, and a PostgreSQL database created for the session
and dropped after it when a server answers on 127.0.0.1:5432 (the postgresql
half is marked `postgres` and skipped without one). Where `RELAYQ_REQUIRE`
names them (tests/conftest.py), a missing PostgreSQL or machine's Redis is a
failure instead of a skip or the embedded broker.
The API: `api`, once per module, serves the session's store and broker from a thread to
the people of `TOKENS`; a module whose people differ overrides it with
`yield from serve_api(durable, ITS_TOKENS)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psycopg
import pytest
import redis
import uvicorn
from fastapi import FastAPI

import tests.durable.agents  # noqa: F401  (the host knows the agents, as a real one would)
from api.app import create_app
from store import Database
from tasks import DurableClient, Settings
from tests.forkserver import Proc, spawn
from tests.lanes import redis_db
from tests.postgres_server import PrivatePostgres, postgres_binaries
from tests.processes import stop_group
from tests.waiting import until
from workers.embedded import ensure_embedded_redis, stop_embedded_redis

if TYPE_CHECKING:
    from tests.conftest import Parts

ROOT = Path(__file__).resolve().parents[2]
PG_ADMIN = os.environ.get("RELAYQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.3):
            return True
    except OSError:
        return False


@dataclass
class Broker:
    url: str
    prefixes: list[str] = field(default_factory=list)

    def new_prefix(self) -> str:
        prefix = f"relayq-test-{uuid.uuid4().hex[:10]}:"
        self.prefixes.append(prefix)
        return prefix

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url.replace("redis+socket://", "unix://"))


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory, machine_parts: Parts) -> Iterator[Broker]:
    # RELAYQ_TEST_EMBEDDED=1 tries the embedded broker, as on a machine without Redis.
    embedded = bool(os.environ.get("RELAYQ_TEST_EMBEDDED"))
    if not embedded and _port_open("127.0.0.1", 6379):
        b = Broker(url=f"redis://127.0.0.1:6379/{redis_db()}")
        yield b
        conn = b.client()
        for prefix in b.prefixes:
            keys = list(conn.scan_iter(match=f"{prefix}*", count=1000))
            if keys:
                conn.delete(*keys)
        return
    if not embedded:
        machine_parts.lacking(
            "redis",
            "no Redis answered on 127.0.0.1:6379",
            instead="the durable tests ran on the embedded one",
        )
    home = tmp_path_factory.mktemp("broker")
    settings = Settings.from_env({"RELAYQ_HOME": str(home)})
    sock = ensure_embedded_redis(settings)
    yield Broker(url=f"redis+socket://{sock}")
    stop_embedded_redis(settings)


def _postgres_url(name: str) -> str:
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    return f"{base}/{name}"


@contextlib.contextmanager
def _postgres_database() -> Iterator[str]:
    """A database of its own on the test server, dropped afterwards."""
    admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=2)
    name = f"relayq_test_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _postgres_url(name)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(
    scope="session", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def database_url(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    machine_parts: Parts,
) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'relayq.db'}"
        return
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=2)
    except psycopg.OperationalError:
        machine_parts.missing(
            "postgres",
            f"no PostgreSQL server at {PG_ADMIN} (start one, or set RELAYQ_TEST_POSTGRES)",
        )
    admin.close()
    with _postgres_database() as url:
        yield url


SQLITE_ONLY = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
"""For a test whose subject is not the store (MCP, Redis connections, the browser's pages,
provider limits, signals, who may answer through which door): SQLite alone, where it would
run on both. What each store does is proven on both, by tests/store and by the durable
tests whose subject it is; running the rest twice cost the suite a fifth of its time."""


@pytest.fixture
def private_database(database_url: str, tmp_path: Path) -> Iterator[str]:
    """A database of the session's kind that no other worker sweeps: for a test whose
    runs must never reach the session's worker (one that kills every worker it meets)."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / 'private.db'}"
        return
    with _postgres_database() as url:
        yield url


@dataclass
class Worker:
    """A `python -m workers worker` process."""

    env: dict[str, str]
    logfile: Path
    proc: Proc | None = None

    def start(self, *extra: str, ready_timeout: float = 60.0) -> Worker:
        name = f"test-{uuid.uuid4().hex[:6]}@%h"
        concurrency = self.env.get("RELAYQ_CONCURRENCY", "2")
        with self.logfile.open("ab") as out:
            self.proc = spawn(
                [sys.executable, "-m", "workers", "worker", "-c", concurrency, "-n", name,
                 "--without-mingle", "--without-gossip", *extra],
                cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + ready_timeout
        while b" ready." not in self.logfile.read_bytes():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.logfile.read_text()[-3000:]}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@dataclass
class Durable:
    """One backend's worker and settings; the test side reads the agents' logs."""

    env: dict[str, str]
    settings: Settings
    log: Path
    worker: Worker
    broker: Broker

    def count(self, kind: str, key: str) -> int:
        path = self.log / f"{kind}.log"
        if not path.exists():
            return 0
        return sum(1 for line in path.read_text().splitlines() if line == key)

    def db(self) -> Database:
        return Database(self.settings.database_url)


@pytest.fixture(scope="session")
def durable(
    broker: Broker, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Durable]:
    home = tmp_path_factory.mktemp("home")
    log = home / "log"
    env = {
        **os.environ,
        "RELAYQ_HOME": str(home),
        "RELAYQ_DATABASE_URL": database_url,
        "RELAYQ_BROKER_URL": broker.url,
        "RELAYQ_KEY_PREFIX": broker.new_prefix(),
        "RELAYQ_AGENTS": "tests.durable.agents",
        "RELAYQ_TEST_LOG": str(log),
        "RELAYQ_RETRY_BASE": "0.02",
        "RELAYQ_MODEL_RETRIES": "2",
    }
    with pytest.MonkeyPatch.context() as session_env:  # restored when the session ends
        session_env.setenv("RELAYQ_TEST_LOG", str(log))
        worker = Worker(env, home / "worker.log").start()
        try:
            yield Durable(env, Settings.from_env(env), log, worker, broker)
        finally:
            worker.stop()


@pytest.fixture
async def client(durable: Durable) -> AsyncIterator[DurableClient]:
    c = DurableClient(settings=durable.settings)
    yield c
    c.close()


@pytest.fixture
def prompt() -> str:
    """A prompt no other test uses, so the agents' logs can be counted per test."""
    return f"prompt {uuid.uuid4().hex}"


Eventually = Callable[..., Awaitable[Any]]


async def poll(
    check: Callable[[], Any], *, timeout: float = 30.0, what: str = "the condition"
) -> Any:
    """`check()` (sync or async) once it returns something truthy; fails the test naming
    `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {timeout:g} s")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.2)


@pytest.fixture
def eventually() -> Eventually:
    """Poll `check` (sync or async) until it returns something truthy, and return that.

    `await eventually(lambda: durable.count("tool", key) == 1, what="the tool to start")`
    """
    return poll


@pytest.fixture
def acked(durable: Durable) -> Callable[[str], bool]:
    """Whether the worker has finished a task message: Celery logs a task's success
    when its body has returned, and acknowledges its message then (acks_late)."""

    def handled(task_id: str) -> bool:
        log = durable.worker.logfile.read_text(errors="replace")
        return f"[{task_id}] succeeded" in log

    return handled


@dataclass
class SpareWorkers:
    """Workers a test starts for itself, on key prefixes of their own, so it may kill them.

    They share the session's database and log folder; a client talks to one
    through `DurableClient(settings=spare.settings)`.
    """

    durable: Durable
    started: list[Worker] = field(default_factory=list)

    def start(self, *args: str, **env: str) -> Durable:
        """A worker on a fresh prefix, with `env` over the session's environment and
        `args` (e.g. `-Q relayq.turns`) for `celery worker`."""
        merged = {**self.durable.env, "RELAYQ_KEY_PREFIX": self.durable.broker.new_prefix(), **env}
        return self._launch(merged, args)

    def restart(self, spare: Durable, *args: str) -> Durable:
        """A new worker in place of `spare`'s (same prefix), as a supervisor would start."""
        spare.worker.stop()
        return self._launch(spare.env, args)

    def kill(self, spare: Durable) -> None:
        """SIGKILL the worker's whole process group, as a machine's death would."""
        proc = spare.worker.proc
        assert proc is not None
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def _launch(self, env: dict[str, str], args: tuple[str, ...] = ()) -> Durable:
        logfile = self.durable.log.parent / f"worker-{uuid.uuid4().hex[:8]}.log"
        worker = Worker(env, logfile)
        self.started.append(worker)
        worker.start(*args)
        return Durable(env, Settings.from_env(env), self.durable.log, worker, self.durable.broker)


@pytest.fixture
def spare_workers(durable: Durable) -> Iterator[SpareWorkers]:
    spares = SpareWorkers(durable)
    yield spares
    for worker in spares.started:
        worker.stop()


@pytest.fixture
async def tag(durable: Durable) -> AsyncIterator[str]:
    """A word to tag a test's refunds with (`tests.durable.desk`); the runs of those still
    open are cancelled after the test, so the inbox's oldest-first pages stay free for
    the next."""
    from .desk import close_open, new_tag  # desk imports this module

    word = new_tag()
    yield word
    await close_open(durable, word)


def unique_name(name: str) -> str:
    """`name` with a part of its own: a batch is known by its jobs file's name, and the
    lane's tests share one store."""
    stem, dot, suffix = name.partition(".")
    return f"{stem}-{uuid.uuid4().hex[:8]}{dot}{suffix}"


# -- the API, over real HTTP from a thread -----------------------------------------------------

VIEWER, APPROVER, OTHER_APPROVER, SUBMITTER = (
    "tok-view-1",
    "tok-approve-1",
    "tok-bob-1",
    "tok-sub-1",
)
HOST = "tok-host-1"
ADMIN = "tok-admin-1"
TOKENS = (
    f"vic:viewer:{VIEWER},alice:approver:{APPROVER},"
    f"bob:approver:{OTHER_APPROVER},sam:submitter:{SUBMITTER},hal:host:{HOST}:*,"
    f"ada:admin:{ADMIN}"
)
"""The API's people most modules share: vic views, alice and bob approve, sam submits;
hal, a host of every relay tool; and ada administers (standing grants)."""
TOKEN_OF_ROLE = {
    "viewer": VIEWER,
    "approver": APPROVER,
    "submitter": SUBMITTER,
    "host": HOST,
    "admin": ADMIN,
}


@dataclass
class ApiServer:
    url: str
    app: FastAPI

    def http(self, token: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            trust_env=False,
            timeout=httpx.Timeout(10, read=30),
            verify=_TLS,
        )


_TLS = httpx.create_ssl_context()
"""One TLS context for every test client (they speak plain HTTP): httpx makes one a client
otherwise, reading the CA bundle each time, 60 CPU-s of a run of the suite."""


def serve_in_thread(app: FastAPI) -> Iterator[ApiServer]:
    """Run `app` under uvicorn on a free port in a thread; stop it after."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", ws="none", lifespan="on"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="api-server", daemon=True)
    thread.start()
    until(lambda: server.started or not thread.is_alive(), what="the API server to start")
    if not server.started:
        raise RuntimeError("the API server stopped before it started")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield ApiServer(url=f"http://127.0.0.1:{port}", app=app)
    finally:
        # relayq's API (not the MCP front, nor another origin's app)
        closing = getattr(getattr(app, "state", None), "closing", None)
        if closing is not None:
            closing.set()  # as `api.server` does on a signal: long polls answer now
        server.should_exit = True
        thread.join(timeout=15)
        # An event stream left open would hold the server up: none may be.
        assert not thread.is_alive(), "the API server did not stop"


@contextlib.contextmanager
def serving(settings: Settings, tokens: str = TOKENS) -> Iterator[ApiServer]:
    """The API on `settings`' store and broker, for the people of `tokens`, until the block ends."""
    yield from serve_in_thread(create_app(settings, tokens=tokens))


def serve_api(durable: Durable, tokens: str = TOKENS) -> Iterator[ApiServer]:
    """What a module's `api` yields: the API on `durable`'s store and broker, for `tokens`."""
    with serving(durable.settings, tokens) as server:
        yield server


@pytest.fixture(scope="module")
def api(durable: Durable) -> Iterator[ApiServer]:
    yield from serve_api(durable)


LISTENING = b"Uvicorn running on"
"""What uvicorn logs once its socket listens: "Application startup complete" comes before
the socket is bound, and a request made on it can be refused."""


def start_api_process(env: dict[str, str], port: int, log: Path, command: str = "api") -> Proc:
    """`relayq api` (or `command`: `mcp`) as a real process on `port`, its output
    (uvicorn's logs) in `log`; the test fails if it does not start within 30 s."""
    with log.open("wb") as out:
        proc = spawn(
            [sys.executable, "-m", "cli.main", command, "--port", str(port)],
            cwd=ROOT, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        until(lambda: started(proc, log, LISTENING), what=f"{command} to start")
    except BaseException:
        stop_group(proc)
        raise
    return proc


def started(proc: Proc, log: Path, line: bytes) -> bool:
    """Whether the process has written `line` to its log; fails the test if it exited."""
    if proc.poll() is not None:
        pytest.fail(f"the process exited ({proc.returncode}):\n{log.read_text()[-3000:]}")
    return line in log.read_bytes()


@pytest.fixture
def private_pg(machine_parts: Parts) -> Iterator[PrivatePostgres]:
    """A PostgreSQL of the test's own, which it may crash, restart or cut off."""
    if postgres_binaries() is None:
        machine_parts.missing("postgres", "no initdb and pg_ctl to make a PostgreSQL of its own")
    with PrivatePostgres() as pg:
        yield pg
