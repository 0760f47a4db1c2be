"""Schema migrations with Alembic, run from code: `migrate(db)` brings a database to head.

Every process that opens the store calls it, and any number may start together on a
new store: a lock keeps them from racing (an advisory lock on PostgreSQL; on SQLite a
file lock beside the database, and the migration in one transaction that takes the
write lock at BEGIN). One that finds another migrating waits for it, then finds the
store at head and goes on. A store already at `HEAD` is told by one query, without
Alembic: importing it costs a process a third of a second, and nearly every process
finds the store at head.
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from store.db import Database, unavailable

if TYPE_CHECKING:
    from alembic.config import Config

__all__ = ["HEAD", "alembic_config", "migrate"]

HEAD = "0015"
"""The newest revision under migrations/versions (a test holds it to Alembic's head)."""

_HERE = Path(__file__).resolve().parent
_LOCK_KEY = 0x72656C6179  # "relay"


def alembic_config(db: Database) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_HERE / "migrations"))
    # The writer: on SQLite the migration's one transaction reads the schema, then changes
    # it; begun deferred, it would fail at its first change while another process writes.
    # Unbounded: a migration of a large store may take long by design.
    config.attributes["engine"] = db.unbounded
    return config


@contextmanager
def _migration_lock(db: Database) -> Iterator[None]:
    if db.is_sqlite:
        path = make_url(db.url).database
        if not path or path == ":memory:":
            yield
            return
        with open(f"{path}.migrate-lock", "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    with db.unbounded.connect() as conn:  # waits for another process's migration
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _LOCK_KEY})
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_KEY})


def migrate(db: Database) -> None:
    """Upgrade the schema to the newest revision (a no-op when it is there already)."""
    # Alembic says at INFO what it is about to do, in every process, every time.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    with db.reachable():
        if _revision(db) == HEAD:
            return
        with _migration_lock(db):
            if _revision(db) == HEAD:
                return  # another process migrated it while this one waited for the lock
            from alembic import command

            command.upgrade(alembic_config(db), "head")


def _revision(db: Database) -> str | None:
    """The store's revision, or None where it has none yet (a new database)."""
    try:
        with db.engine.connect() as conn:
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    except DBAPIError as exc:
        if unavailable(exc, db.address) is not None:
            raise
        return None  # no alembic_version table: Alembic creates it
