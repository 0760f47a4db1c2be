"""Connecting to the store: SQLite (WAL) by default, PostgreSQL by URL.

SQLite takes its write lock at BEGIN for write transactions (`BEGIN
IMMEDIATE`): a transaction that reads, then writes, would otherwise fail with
"database is locked" when two processes upgrade their locks at once. A writer
waits for the lock up to the busy timeout (`RELAYQ_SQLITE_BUSY_TIMEOUT`, 30 s), and so
does a connection that finds another making a new file a WAL database.

Every way into the store (`write`, `transaction`, `read`, `snapshot`,
`connect`) turns an error that a later try may not meet (the server down or
restarting, a dropped connection, SQLite's lock held past the busy timeout, a
serialization failure) into one `StoreUnavailable`, naming the store without
its password and the SQL never. Any other error passes unchanged.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DataError, DBAPIError, DisconnectionError, StatementError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlmodel import Session, create_engine

from relayq import UnstorableInput
from store.errors import StoreBusy, StoreUnavailable
from store.sqlite_writes import SqliteWrites, locked
from store.stalls import UNBOUNDED, StallWatch

__all__ = [
    "Database",
    "StoreBusy",
    "default_database_url",
    "impatient",
    "unavailable",
    "unkeepable",
]

_WRITE = "relayq_write"
BUSY_TIMEOUT_ENV = "RELAYQ_SQLITE_BUSY_TIMEOUT"
CONNECT_TIMEOUT_ENV = "RELAYQ_STORE_CONNECT_TIMEOUT"
SILENT_AFTER_ENV = "RELAYQ_STORE_SILENT_AFTER"
STATEMENT_TIMEOUT_ENV = "RELAYQ_STORE_STATEMENT_TIMEOUT"
CONNECTIONS_ENV = "RELAYQ_STORE_CONNECTIONS"

_impatient: ContextVar[bool] = ContextVar("relayq_impatient", default=False)


@contextmanager
def impatient() -> Iterator[None]:
    """While open, the first write transaction on SQLite takes the lock only if no other
    process holds it now, else fails at once with StoreBusy (nothing done): a caller on an
    event loop then waits for it elsewhere (`tasks.runner.runtime.Runtime.io`) instead of blocking
    the loop. This process's own writers are waited for (`store.sqlite_writes`): each
    holds the lock for one short transaction.

    Only the first: a store call whose first write went through may have committed it, and
    is not cut short after that.
    """
    token = _impatient.set(True)
    try:
        yield
    finally:
        _impatient.reset(token)


def _seconds(variable: str, default: float, minimum: float = 0.0) -> float:
    raw = os.environ.get(variable) or str(default)
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"{variable} must be a number of seconds, not {raw!r}") from None
    if seconds < minimum:
        raise ValueError(f"{variable} must be {minimum:g} seconds or more, not {raw!r}")
    return seconds


def _busy_timeout() -> float:
    return _seconds(BUSY_TIMEOUT_ENV, 30)


def _connections() -> tuple[int, int]:
    """The pool's size and overflow: RELAYQ_STORE_CONNECTIONS at most, 24 of them kept open
    between uses (enough for every I/O thread of a worker), the rest closed after one."""
    raw = os.environ.get(CONNECTIONS_ENV) or "40"
    if not raw.isascii() or not raw.isdigit() or int(raw) < 2:
        raise ValueError(f"{CONNECTIONS_ENV} must be a whole number, 2 or more, not {raw!r}")
    most = int(raw)
    kept = min(24, most)
    return kept, most - kept


@dataclass(frozen=True)
class Bounds:
    """How long a PostgreSQL connection may keep relayq waiting (docs/configuration.md)."""

    connect: float
    """A new connection's answer, TLS and authentication included."""
    statement: float
    """One statement on the server (`statement_timeout`)."""
    silent: float
    """An open connection that answers nothing: TCP keepalives and tcp_user_timeout, and
    a round trip waiting this long is cut (`store.stalls`)."""

    @classmethod
    def from_env(cls) -> Bounds:
        bounds = cls(
            connect=_seconds(CONNECT_TIMEOUT_ENV, 10, minimum=2),
            statement=_seconds(STATEMENT_TIMEOUT_ENV, 15, minimum=1),
            silent=_seconds(SILENT_AFTER_ENV, 20, minimum=4),
        )
        if bounds.silent <= bounds.statement:
            raise ValueError(
                f"{SILENT_AFTER_ENV} ({bounds.silent:g} s) must be longer than "
                f"{STATEMENT_TIMEOUT_ENV} ({bounds.statement:g} s): a statement the server "
                "is still running would be taken for a silent connection"
            )
        return bounds

    def connect_args(self, options: str | None = None) -> dict[str, Any]:
        """libpq's parameters: connecting, a peer gone silent on an open connection (which
        TCP keepalives and tcp_user_timeout find, where nothing acknowledges its packets),
        and the server's bound on each statement; after `options` the URL gave."""
        probe = max(1, int(self.silent / 4))
        # A transaction left idle past the silence bound is one whose client went silent:
        # the server ends it, or the row locks it holds would stop every later try for good.
        timeout = (
            f"-c statement_timeout={int(self.statement * 1000)}"
            f" -c idle_in_transaction_session_timeout={int(self.silent * 1000)}"
        )
        return {
            "connect_timeout": max(2, round(self.connect)),  # libpq: whole seconds, at least 2
            "keepalives": 1,
            "keepalives_idle": probe,
            "keepalives_interval": probe,
            "keepalives_count": 3,
            "tcp_user_timeout": int(self.silent * 1000),
            "options": f"{options} {timeout}" if options else timeout,
        }


# SQLSTATEs a later try may not meet: connection exceptions (08), the server shutting
# down, crashed or starting (57P0x), too many connections, and lost transaction races.
_TRANSIENT_STATES = {
    "57P01": "the server is shutting down",
    "57P02": "the server crashed",
    "57P03": "the server is starting or stopping",
    "53300": "too many connections",
    "40001": "a serialization failure",
    "40P01": "a deadlock",
    "57014": "a statement ran past its timeout",
}
# psycopg's errors of a connection that answers nothing, which carry no SQLSTATE: by
# name, so that the store's classification needs no driver import.
_SILENT = {
    "ConnectionTimeout": "the connection timed out",
    "CancellationTimeout": "the connection timed out",
}


def unavailable(exc: BaseException, address: str) -> StoreUnavailable | None:
    """`exc` as a StoreUnavailable when trying again later may succeed, else None.

    Every connection-class error is one, by its class: a refused or lost connection, one
    that timed out connecting or went silent (psycopg's ConnectionTimeout and its
    siblings, SQLAlchemy's DisconnectionError), a statement cancelled by its timeout."""
    if isinstance(exc, PoolTimeout):
        return StoreUnavailable(address, "no connection free in the pool")
    if isinstance(exc, DisconnectionError):
        return StoreUnavailable(address, "the connection was lost")
    if not isinstance(exc, DBAPIError):
        return None
    return _driver_unavailable(exc, address)


def _driver_unavailable(exc: DBAPIError, address: str) -> StoreUnavailable | None:
    """The driver's error (`exc.orig`) as a StoreUnavailable, by its class and SQLSTATE."""
    orig = exc.orig
    silent = _SILENT.get(type(orig).__name__)
    if silent is not None:
        return StoreUnavailable(address, silent)
    if isinstance(orig, sqlite3.OperationalError):
        if locked(orig):
            return StoreUnavailable(address, "the database file is locked")
        return None
    state = getattr(orig, "sqlstate", None)
    if isinstance(state, str):
        if state.startswith("08"):
            return StoreUnavailable(address, "the connection failed")
        reason = _TRANSIENT_STATES.get(state)
        return None if reason is None else StoreUnavailable(address, reason)
    if exc.connection_invalidated:
        return StoreUnavailable(address, "the connection was lost")
    if any(kind.__name__ == "OperationalError" for kind in type(orig).__mro__):
        # The driver's own failure to reach the server: no SQLSTATE, no server reply.
        refused = "refused" in str(orig).lower()
        return StoreUnavailable(address, "connection refused" if refused else "no connection")
    return None


def unkeepable(exc: BaseException) -> UnstorableInput | None:
    """`exc` as UnstorableInput where a value given to a statement (a filter, an id, a
    text to keep) holds what no store can: a NUL character (PostgreSQL's text refuses it)
    or a lone surrogate (no driver encodes it). Whatever other route a value takes in,
    it ends here, as the error its caller shows (a 422, one line), never a 500."""
    orig = exc.orig if isinstance(exc, StatementError) else exc
    if isinstance(exc, DataError) and "NUL" in str(orig):
        return UnstorableInput(
            "a value given holds a NUL character (\\x00), which the store cannot keep"
        )
    if isinstance(orig, UnicodeEncodeError) and "surrogate" in str(orig):
        return UnstorableInput("a value given holds a lone surrogate: it is not valid UTF-8")
    return None


def _raise_unkeepable(exc: BaseException) -> None:
    refused = unkeepable(exc)
    if refused is not None:
        raise refused from None


def default_database_url() -> str:
    """`RELAYQ_DATABASE_URL`, else a SQLite file at `$RELAYQ_HOME/relayq.db` (`.relayq/`)."""
    url = os.environ.get("RELAYQ_DATABASE_URL")
    if url:
        return url
    home = Path(os.environ.get("RELAYQ_HOME", ".relayq")).resolve()
    return f"sqlite:///{home / 'relayq.db'}"


SQLITE_PAGE_SIZE = 1024
"""Bytes a page of a new SQLite store. A turn changes about twenty pages, a row or an
index entry each, and the write-ahead log takes each page whole: 20 kB logged a turn
against 78 with SQLite's 4 kB default (37 kB written a turn with the checkpoints,
`bench.turns`, against 102). A large message spills into overflow pages: that costs its
writes nothing, and reading a long transcript of such messages about 1.7x."""


WAL_CHECKPOINT_BYTES = 4 * 1024 * 1024
"""SQLite's default checkpoint (1,000 pages) at its default page size: with 1 KiB pages,
1,000 pages would checkpoint four times as often, and a turn would write 42 kB instead of
37 (`bench.turns`, 3,200 turns)."""


def _use_wal(cur: Any, busy_timeout: float) -> None:
    """Make the database a WAL one (a no-op once it is), waiting up to the busy timeout
    for a process that holds its lock: on a new file, the first to open it is switching it.

    SQLite calls no busy handler here: the switch reads the file, then needs its write
    lock, and a read that wants to write fails at once ("database is locked") while
    another holds that lock, so `relayq worker` and `relayq api` started together on a new
    store could kill one another. Tried again until the busy timeout, as a writer waits.
    """
    deadline = time.monotonic() + busy_timeout
    pause = 0.001
    while True:
        try:
            # A new file also gives pages a purge frees back to the file system
            # (`store.retention.give_back_space`); only while it is empty, since on a
            # file in that mode already the pragma is a write.
            if cur.execute("PRAGMA page_count").fetchone()[0] == 0:
                # Small pages: a transaction appends each page it changed to the log whole,
                # and a turn's are mostly a row or an index entry each (issue 26).
                cur.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
                cur.execute("PRAGMA auto_vacuum=INCREMENTAL")
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _sqlite_engine(url: str, busy_timeout: float, *, waits: bool = True) -> Engine:
    """An engine on SQLite's file; its connections wait up to `busy_timeout` for the write
    lock, or (`waits=False`: the writers of `SqliteWrites`) not at all."""
    path = make_url(url).database
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    wait = busy_timeout if waits else 0.0
    engine = create_engine(
        url,
        connect_args={"timeout": wait, "check_same_thread": False},
        hide_parameters=True,
        pool_size=24,
        max_overflow=16,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event, not the driver, open transactions.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        _use_wal(cur, busy_timeout)
        cur.execute("PRAGMA synchronous=NORMAL")
        # The log is copied back into the file each WAL_CHECKPOINT_BYTES, whatever the page
        # size: a page changed many times between two checkpoints is copied once.
        page = cur.execute("PRAGMA page_size").fetchone()[0]
        cur.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_BYTES // page}")
        cur.execute(f"PRAGMA busy_timeout={int(wait * 1000)}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        write = conn.get_execution_options().get(_WRITE)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write or not waits else "BEGIN")

    return engine


def _lift_timeouts(conn: Connection) -> None:
    if conn.get_execution_options().get(UNBOUNDED):
        conn.exec_driver_sql(
            "SET LOCAL statement_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 0"
        )


class Database:
    """An engine and its two kinds of session: `write()` transactions and `read()`s."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or default_database_url()
        self.address = make_url(self.url).render_as_string(hide_password=True)
        """The store's URL without its password: what errors and logs name."""
        self._sqlite_writes: SqliteWrites | None = None
        """SQLite's write transactions of this process (`store.sqlite_writes`)."""
        self.stalls: StallWatch | None = None
        """PostgreSQL's round trips in flight, and their cutting when silent."""
        if self.url.startswith("sqlite"):
            busy_timeout = _busy_timeout()
            self.engine = _sqlite_engine(self.url, busy_timeout)
            self._sqlite_writes = SqliteWrites(
                _sqlite_engine(self.url, busy_timeout, waits=False), busy_timeout=busy_timeout
            )
        else:
            # hide_parameters: an error's text (logged, or stored) never carries the
            # transcript or an answer it was writing.
            bounds = Bounds.from_env()
            kept, beyond = _connections()
            options = make_url(self.url).query.get("options")
            self.engine = create_engine(
                self.url,
                connect_args=bounds.connect_args(options if isinstance(options, str) else None),
                pool_size=kept,
                max_overflow=beyond,
                hide_parameters=True,
            )
            # The pool's pre-ping is the watch's, as a round trip it can cut.
            self.stalls = StallWatch(self.engine, bound=bounds.silent)
            event.listen(self.engine, "begin", _lift_timeouts)
        self._writer = self.engine.execution_options(**{_WRITE: True})
        self.unbounded = self._writer.execution_options(**{UNBOUNDED: True})
        """The writer, for statements that may take long by design (a migration, its lock):
        no statement timeout, and never taken for a silent connection's."""
        self._autocommit = self._writer.execution_options(isolation_level="AUTOCOMMIT")
        # SQLite's reads already share one snapshot per transaction (WAL); PostgreSQL's
        # READ COMMITTED takes one per statement.
        self._snapshot = (
            self.engine
            if self.is_sqlite
            else self.engine.execution_options(isolation_level="REPEATABLE READ")
        )

    @property
    def is_sqlite(self) -> bool:
        return self.engine.dialect.name == "sqlite"

    @property
    def engines(self) -> tuple[Engine, ...]:
        """Every engine of this store, for a listener of their events: the reads' (and
        PostgreSQL's writes'), and on SQLite the write transactions' own."""
        if self._sqlite_writes is None:
            return (self.engine,)
        return (self.engine, self._sqlite_writes.engine)

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction, committed on exit, rolled back on an exception."""
        if self._sqlite_writes is not None:
            # The session joins the transaction, which commits it: flushed, nothing more.
            with self.transaction() as conn, Session(bind=conn, expire_on_commit=False) as s:
                yield s
                s.flush()
            return
        with (
            self.reachable(),
            Session(self._writer, expire_on_commit=False) as session,
            session.begin(),
        ):
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self.reachable(), Session(self.engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A read whose statements all see the same data: a page and its total agree."""
        with self.reachable(), Session(self._snapshot, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction on a bare connection: for the statements every turn runs,
        where an ORM session would cost more than the SQL."""
        if self._sqlite_writes is None:
            with self.reachable(), self._writer.begin() as conn:
                yield conn
            return
        impatient = _impatient.get()
        if impatient:
            _impatient.set(False)  # the call's first write only: see `impatient`
        with (
            self.reachable(busy=impatient),
            self._sqlite_writes.transaction(impatient=impatient) as conn,
        ):
            yield conn

    @contextmanager
    def single(self) -> Iterator[Connection]:
        """A write of one statement, atomic by itself. On PostgreSQL it goes without BEGIN
        and COMMIT, one round trip where a transaction takes three (a turn's claim); on
        SQLite it is a `transaction()`, whose BEGIN and COMMIT cost no round trip."""
        if self._sqlite_writes is not None:
            with self.transaction() as conn:
                yield conn
            return
        with self.reachable(), self._autocommit.connect() as conn:
            yield conn

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A bare connection for reads, outside any write transaction."""
        with self.reachable(), self.engine.connect() as conn:
            yield conn

    @contextmanager
    def reachable(self, *, busy: bool = False) -> Iterator[None]:
        """Turn an error a later try may not meet into StoreUnavailable (see the module);
        `busy`: in an impatient call's first write, where it is StoreBusy (nothing done)."""
        try:
            yield
        except (DBAPIError, PoolTimeout, DisconnectionError) as exc:
            error = unavailable(exc, self.address)
            if error is None:
                _raise_unkeepable(exc)
                raise
            if busy:
                raise StoreBusy(error.address, error.reason, error.retry_after) from None
            raise error from None

        except (StatementError, UnicodeEncodeError) as exc:
            _raise_unkeepable(exc)
            raise

    def dispose(self) -> None:
        if self.stalls is not None:
            self.stalls.close()
        if self._sqlite_writes is not None:
            self._sqlite_writes.engine.dispose()
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({self.address!r})"
