"""`relayq purge`: remove finished work from the store (`store.retention`)."""

from __future__ import annotations

import contextlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from cli._common import age_of, console, fail, settings, user_errors
from relayq import RelayqError
from store import Database
from store.retention import Purged, purge_finished

__all__ = ["purge"]


def purge(
    finished_before: Annotated[
        str,
        typer.Option(
            help="Remove runs finished at least this long ago: 90s, 15m, 2h, 30d, 1w.",
            show_default=False,
        ),
    ],
    export: Annotated[
        Path | None,
        typer.Option(
            help="First write each run (its transcript, requests, decisions, batch and job) "
            "as one JSON line to a new file in this folder; a run not written stays.",
            show_default=False,
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would go; remove nothing.")
    ] = False,
) -> None:
    """Remove finished runs (done, failed, cancelled, incomplete, over budget) last
    changed before the age given, with all that is theirs alone: messages, ledger,
    requests and their votes, relay calls and leases, events and webhook deliveries,
    and a batch with its last run. The audit trail stays. A few runs a transaction,
    beside live work; a run that is queued, running or waiting is never touched.
    """
    before = datetime.now(UTC) - age_of(finished_before, "--finished-before")
    if export is not None and dry_run:
        fail("--dry-run writes nothing and removes nothing: leave out --export, or --dry-run")
    current = settings()
    with user_errors(current):
        db = Database(current.database_url)
        archive = None if export is None else Archive.create(export)
        try:
            purged = purge_finished(
                db, before, dry_run=dry_run, export=None if archive is None else archive.write
            )
        finally:
            db.dispose()
            if archive is not None:
                archive.close()
    print_purged(purged, dry_run=dry_run, before=before)
    if archive is not None:
        console().print(f"wrote {archive.runs} runs to {archive.path}")


class ExportFailed(RelayqError):
    """The export's file could not take a chunk: the purge stopped, its runs stay."""


class Archive:
    """The export's file: new, readable by its owner alone (it holds prompts and
    answers), each chunk on disk before its runs are removed, and a chunk that failed
    halfway cut off again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs = 0
        self._file = os.fdopen(
            os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8"
        )

    @classmethod
    def create(cls, folder: Path) -> Archive:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
            return cls(folder / f"relayq-runs-{stamp}.jsonl")
        except OSError as exc:
            fail(f"cannot write an export in {folder}: {exc.strerror or exc}")

    def write(self, runs: list[dict[str, Any]]) -> None:
        start = self._file.tell()
        try:
            for run in runs:
                self._file.write(json.dumps(run, ensure_ascii=False, separators=(",", ":")))
                self._file.write("\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            with contextlib.suppress(OSError):
                self._file.truncate(start)
            raise ExportFailed(
                f"could not write {self.path}: {exc.strerror or exc}; the runs not written "
                f"stay ({self.runs} written and removed before it)"
            ) from exc
        self.runs += len(runs)

    def close(self) -> None:
        self._file.close()


def print_purged(purged: Purged, *, dry_run: bool, before: datetime) -> None:
    out = console()
    verb = "would remove" if dry_run else "removed"
    cut = before.strftime("%Y-%m-%d %H:%M:%S UTC")
    if not purged.rows:
        out.print(f"no finished run last changed before {cut}: nothing to remove")
        return
    out.print(f"{verb} {purged.runs} finished runs last changed before {cut}:")
    for table, count in sorted(purged.rows.items()):
        out.print(f"  {table.removeprefix('relayq_'):<18} {count:>10,}")
