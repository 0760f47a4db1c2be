"""Schema migrations with Alembic, run from code: `migrate(db)` brings a database to head.

Every process that opens the store calls it; a lock keeps two from racing
(an advisory lock on PostgreSQL, a file lock beside a SQLite database).
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import make_url

from store.db import Database

__all__ = ["alembic_config", "migrate"]

_HERE = Path(__file__).resolve().parent
_LOCK_KEY = 0x72656C6179  # "relay"


def alembic_config(db: Database) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_HERE / "migrations"))
    config.attributes["engine"] = db.engine
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
    with db.engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _LOCK_KEY})
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _LOCK_KEY})


def migrate(db: Database) -> None:
    """Upgrade the schema to the newest revision (a no-op when it is there already)."""
    # Alembic says at INFO what it is about to do, in every process, every time.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    with db.reachable(), _migration_lock(db):
        command.upgrade(alembic_config(db), "head")
