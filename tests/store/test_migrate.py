"""Rule 1: the schema comes from the migrations, and they match the models."""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlmodel import SQLModel

from store import Database, get_run, migrate
from store.migrate import HEAD, alembic_config

from .driver import start


def schema_of(db: Database) -> dict[str, Any]:
    inspector = inspect(db.engine)
    return {
        table: (
            [(c["name"], str(c["type"]), c["nullable"]) for c in inspector.get_columns(table)],
            sorted(
                (i["name"] or "", tuple(i["column_names"])) for i in inspector.get_indexes(table)
            ),
            inspector.get_pk_constraint(table)["constrained_columns"],
        )
        for table in sorted(inspector.get_table_names())
    }


def head_revision(db: Database) -> str:
    """The newest migration's revision."""
    head = ScriptDirectory.from_config(alembic_config(db)).get_current_head()
    assert head is not None
    return head


def revision_of(db: Database) -> list[str]:
    with db.engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT version_num FROM alembic_version"))]


def test_migrating_a_migrated_database_again_changes_nothing(db: Database):
    start(db)
    schema, revision = schema_of(db), revision_of(db)

    migrate(db)
    migrate(db)

    assert schema_of(db) == schema
    assert revision_of(db) == revision == [head_revision(db)]
    assert get_run(db, "run_1").status == "queued", "the data survived"


def test_the_migrations_build_exactly_the_tables_the_models_describe(db: Database):
    with db.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        drift = compare_metadata(context, SQLModel.metadata)

    assert drift == []


def test_head_names_the_newest_migration_so_a_store_there_skips_alembic(db: Database):
    assert head_revision(db) == HEAD


def test_a_store_a_revision_behind_is_brought_to_head(db: Database):
    # Given a store whose last migration was undone
    start(db)
    command.downgrade(alembic_config(db), "-1")
    assert revision_of(db) != [HEAD]

    # When a process opens it, the migration is run again, and the data is kept
    migrate(db)
    assert revision_of(db) == [HEAD]
    assert get_run(db, "run_1").status == "queued"
