"""Connecting to the store: SQLite (WAL) by default, PostgreSQL by URL.

SQLite takes its write lock at BEGIN for write transactions (`BEGIN
IMMEDIATE`): a transaction that reads, then writes, would otherwise fail with
"database is locked" when two processes upgrade their locks at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.engine import make_url
from sqlmodel import Session, create_engine

__all__ = ["Database", "default_database_url"]

_WRITE = "relayq_write"


def default_database_url() -> str:
    """`RELAYQ_DATABASE_URL`, else a SQLite file at `$RELAYQ_HOME/relayq.db` (`.relayq/`)."""
    url = os.environ.get("RELAYQ_DATABASE_URL")
    if url:
        return url
    home = Path(os.environ.get("RELAYQ_HOME", ".relayq")).resolve()
    return f"sqlite:///{home / 'relayq.db'}"


def _sqlite_engine(url: str) -> Engine:
    path = make_url(url).database
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"timeout": 30, "check_same_thread": False},
        hide_parameters=True,
        pool_size=24,
        max_overflow=16,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event, not the driver, open transactions.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        immediate = conn.get_execution_options().get(_WRITE)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


class Database:
    """An engine and its two kinds of session: `write()` transactions and `read()`s."""

    def __init__(self, url: str | None = None) -> None:
        self.url = url or default_database_url()
        if self.url.startswith("sqlite"):
            self.engine = _sqlite_engine(self.url)
        else:
            # Enough pooled connections for every I/O thread of a worker: a
            # connection opened beyond the pool is closed again after one use.
            # hide_parameters: an error's text (logged, or stored) never carries the
            # transcript or an answer it was writing.
            self.engine = create_engine(
                self.url, pool_pre_ping=True, pool_size=24, max_overflow=16, hide_parameters=True
            )
        self._writer = self.engine.execution_options(**{_WRITE: True})
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

    @contextmanager
    def write(self) -> Iterator[Session]:
        """One transaction, committed on exit, rolled back on an exception."""
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def snapshot(self) -> Iterator[Session]:
        """A read whose statements all see the same data: a page and its total agree."""
        with Session(self._snapshot, expire_on_commit=False) as session:
            yield session

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction on a bare connection: for the statements every turn runs,
        where an ORM session would cost more than the SQL."""
        with self._writer.begin() as conn:
            yield conn

    def dispose(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({make_url(self.url).render_as_string(hide_password=True)!r})"
