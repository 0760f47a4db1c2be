"""One store suite, two databases: a fresh SQLite file per test, and PostgreSQL when it answers.

SQLite: each test's file is a copy of one migrated once per session (running the
migrations for each of 300 tests cost more than most of the tests).

PostgreSQL: a database `relayq_store_test_<hex>` is created and migrated once
per session, every relayq table is emptied before and after each test, and
the database is dropped at the end. Without a server on 127.0.0.1:5432 (or
`RELAYQ_TEST_POSTGRES`), the postgresql half of the suite (marked `postgres`)
is skipped, or fails where `RELAYQ_REQUIRE` names postgres (tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlmodel import SQLModel

from store import Database, migrate

PG_ADMIN = os.environ.get("RELAYQ_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
RELAYQ_TABLES = [t.name for t in SQLModel.metadata.sorted_tables if t.name.startswith("relayq_")]


NO_POSTGRES = f"no PostgreSQL server at {PG_ADMIN} (start one, or set RELAYQ_TEST_POSTGRES)"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tests that take `pg` run on PostgreSQL only (the `db` fixture marks its own half).
    # The hook sees the whole session's items: only this folder's are looked at.
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here) and "pg" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


def _postgres_url(name: str) -> str:
    base = PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{name}"


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str | None]:
    """A migrated database of this session only, or None when no server answers."""
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=2)
    except psycopg.OperationalError:
        yield None
        return
    name = f"relayq_store_test_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = _postgres_url(name)
        db = Database(url)
        try:
            migrate(db)
        finally:
            db.dispose()
        yield url
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head, with no rows: the template of each test's store."""
    path = tmp_path_factory.mktemp("template") / "relayq.db"
    db = Database(f"sqlite:///{path}")
    try:
        migrate(db)
    finally:
        db.dispose()
    return path


@contextmanager
def _sqlite(template: Path, folder: Path) -> Iterator[Database]:
    path = folder / "relayq.db"
    shutil.copyfile(template, path)
    db = Database(f"sqlite:///{path}")
    try:
        migrate(db)  # finds it at head, as a worker opening a migrated store does
        yield db
    finally:
        db.dispose()


def _empty(db: Database) -> None:
    with db.engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(RELAYQ_TABLES)} RESTART IDENTITY"))


@contextmanager
def _postgres(request: pytest.FixtureRequest) -> Iterator[Database]:
    url = request.getfixturevalue("postgres_url")
    if url is None:
        request.getfixturevalue("machine_parts").missing("postgres", NO_POSTGRES)
    db = Database(url)
    try:
        _empty(db)
        yield db
    finally:
        _empty(db)
        db.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    """A migrated, empty store, on each database in turn."""
    if request.param == "sqlite":
        store = _sqlite(request.getfixturevalue("migrated_sqlite"), tmp_path)
    else:
        store = _postgres(request)
    with store as database:
        yield database


@pytest.fixture
def lite(migrated_sqlite: Path, tmp_path: Path) -> Iterator[Database]:
    """A migrated, empty store on SQLite, for what only SQLite can show."""
    with _sqlite(migrated_sqlite, tmp_path) as database:
        yield database


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[Database]:
    """A migrated, empty store on PostgreSQL, for what only PostgreSQL can show."""
    with _postgres(request) as database:
        yield database
