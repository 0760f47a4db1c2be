"""Thousands of stored rows for the volume tests, at the speed of the insert rather than
of the models: a SQLModel table model takes about 0.3 ms to build, so 100,000 of them
cost half a minute before the first row is written."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import insert
from sqlmodel import SQLModel

from store import Database

__all__ = ["insert_rows", "rows_like"]


def rows_like(
    template: SQLModel, count: int, vary: Callable[[int], dict[str, Any]]
) -> list[dict[str, Any]]:
    """`count` rows of `template`'s table: its columns (defaults and all, built once) with
    `vary(n)` over them for the n-th row. `vary` sets every column that must differ, ids
    first: a default made per model (a fresh id, the time) is the same in every row."""
    base = template.model_dump()
    return [base | vary(n) for n in range(count)]


def insert_rows(
    db: Database, model: type[SQLModel], rows: Iterable[dict[str, Any]], chunk: int = 5000
) -> None:
    """Insert `rows` into `model`'s table in one transaction, `chunk` rows a statement."""
    table = model.__table__  # type: ignore[attr-defined]
    batch = list(rows)
    with db.write() as s:
        for start in range(0, len(batch), chunk):
            s.execute(insert(table), batch[start : start + chunk])
