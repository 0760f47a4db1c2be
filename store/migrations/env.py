"""Alembic environment: the engine comes from `store.migrate`, never from a config file."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import store.models  # noqa: F401  (registers the tables on the metadata)

config = context.config
engine = config.attributes["engine"]

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=SQLModel.metadata,
        render_as_batch=engine.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
