"""`relayq purge`: remove finished work from the store (`store.retention`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from cli._common import age_of, console, settings, user_errors
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
    before = datetime.now(UTC) - age_of(finished_before)
    current = settings()
    with user_errors(current):
        db = Database(current.database_url)
        try:
            purged = purge_finished(db, before, dry_run=dry_run)
        finally:
            db.dispose()
    print_purged(purged, dry_run=dry_run, before=before)


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
