"""Every store transaction, statement and commit a worker makes, one line each in
`sql.log` under `RELAYQ_TEST_LOG`: what the turn-cost tests count (issue 38).

A worker loads it as one of its agent modules (`RELAYQ_AGENTS=bench.agents,
tests.durable.store_counter`); its listeners are on SQLAlchemy's `Engine` class, so they
see every engine the process makes. A statement is recorded by its shape: its verb and
the table it names, so a test's failure names the statement that was added.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.pool import Pool

__all__ = ["LOCKED", "LOG_NAME", "SWITCH", "shape", "store_calls"]

LOG_NAME = "sql.log"
LOCKED = "locked"
"""The line of a BEGIN that found SQLite's write lock held by another process."""
SWITCH = "RELAYQ_TEST_COUNT_STORE"
"""Set (to 1) in the environment of a process whose store calls are to be recorded: the
listeners of a process that imports this module for `shape` record nothing."""

_VERB = re.compile(r"^\s*(\w+)")
_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE|TABLE)\s+\"?(\w+)", re.IGNORECASE)


def shape(statement: str) -> str:
    """`UPDATE runs`, `SELECT workers`, `PRAGMA`: what a statement does, and to which table."""
    verb = _VERB.match(statement)
    word = verb.group(1).upper() if verb else "?"
    if word in ("BEGIN", "COMMIT", "ROLLBACK", "PRAGMA", "SET", "SAVEPOINT", "RELEASE"):
        return word
    table = _TABLE.search(statement)
    return f"{word} {table.group(1)}" if table else word


def _write(line: str) -> None:
    root = os.environ.get("RELAYQ_TEST_LOG")
    if root is None or not os.environ.get(SWITCH):
        return
    Path(root).mkdir(parents=True, exist_ok=True)
    # One `write` on an O_APPEND file: whole lines, whichever thread writes.
    fd = os.open(Path(root) / LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@event.listens_for(Engine, "before_cursor_execute")
def _statement(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
    _write(f"statement {shape(statement)}")


@event.listens_for(Pool, "connect")
def _connected(dbapi_conn: Any, _record: Any) -> None:
    # SQLite: every statement the library runs, those sent on the driver's own
    # connection (a PRAGMA) and those it sends itself included.
    if isinstance(dbapi_conn, sqlite3.Connection):
        dbapi_conn.set_trace_callback(lambda sql: _write(f"sqlite {shape(sql)}"))


@event.listens_for(Pool, "checkout")
def _checkout(*_: Any) -> None:
    _write("checkout")


@event.listens_for(Pool, "reset")
def _reset(*_: Any) -> None:
    _write("reset")


@event.listens_for(Engine, "begin")
def _begin(conn: Any) -> None:
    _write("transaction")


@event.listens_for(Engine, "commit")
def _commit(conn: Any) -> None:
    _write("commit")


@event.listens_for(Engine, "handle_error")
def _failed(context: Any) -> None:
    # A BEGIN IMMEDIATE that found SQLite's lock held by another process: the writer
    # checks its connection back in and asks again (`store.sqlite_writes`).
    if context.statement == "BEGIN IMMEDIATE" and "locked" in str(context.original_exception):
        _write(LOCKED)


def store_calls(log: Path) -> list[str]:
    """The lines recorded so far, in order."""
    path = log / LOG_NAME
    return path.read_text().splitlines() if path.exists() else []
