"""Worker heartbeats: a claim lasts while the process holding it is alive.

Each process that runs turns writes its row every few seconds. A run claimed
by a process whose heartbeat stopped is taken over by the next sweep, within
seconds of the death, however long a live worker's turns take: one row per
process to keep fresh, not one per run in flight.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import bindparam
from sqlmodel import Session, col, select

from store.db import Database
from store.models import RunRow, WorkerRow, utcnow

__all__ = [
    "WORKER_TIMEOUT",
    "beat",
    "forget_worker",
    "holder_alive",
    "live_workers",
    "prune_workers",
]

WORKER_TIMEOUT = timedelta(seconds=10)
HOSTNAME = socket.gethostname()

_TABLE = WorkerRow.__table__  # type: ignore[attr-defined]
_TOUCH = (
    _TABLE.update().where(_TABLE.c.id == bindparam("wid")).values(heartbeat_at=bindparam("now"))
)


def beat(db: Database, worker_id: str, *, hostname: str, pid: int) -> None:
    """Say the worker is alive now (its first beat registers it)."""
    now = utcnow()
    with db.transaction() as conn:
        if conn.execute(_TOUCH, {"wid": worker_id, "now": now}).rowcount:
            return
        conn.execute(
            _TABLE.insert(),
            {
                "id": worker_id,
                "hostname": hostname,
                "pid": pid,
                "started_at": now,
                "heartbeat_at": now,
            },
        )


def forget_worker(db: Database, worker_id: str) -> None:
    """The worker is exiting: its claims are taken over at the next sweep, not a timeout later."""
    with db.transaction() as conn:
        conn.execute(_TABLE.delete().where(_TABLE.c.id == worker_id))


def prune_workers(db: Database, *, older_than: timedelta, now: datetime | None = None) -> int:
    """Forget workers silent for long; a run they held is taken over all the same."""
    cutoff = (now or utcnow()) - older_than
    with db.transaction() as conn:
        return int(conn.execute(_TABLE.delete().where(_TABLE.c.heartbeat_at < cutoff)).rowcount)


def _process_gone(pid: int) -> bool:
    """No process `pid` on this host, or only its zombie (killed, not yet reaped)."""
    stat = Path(f"/proc/{pid}/stat")
    try:
        # The state follows the parenthesised command name, which may hold spaces.
        return stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _alive(row: WorkerRow | None, *, now: datetime, timeout: timedelta | None) -> bool:
    if row is None or (timeout is not None and row.heartbeat_at < now - timeout):
        return False
    # On this very host a dead process is certain at once, not a timeout later.
    return not (row.hostname == HOSTNAME and row.pid != os.getpid() and _process_gone(row.pid))


def holder_alive(s: Session, run: RunRow, *, now: datetime, timeout: timedelta | None) -> bool:
    """Whether the worker holding `run`'s claim may still be working on it.

    A claim with no worker behind it (made outside a worker) is held by nobody
    a redelivery could wait for. `timeout` None: a stale heartbeat proves nothing now.
    """
    if run.worker is None:
        return False
    return _alive(s.get(WorkerRow, run.worker), now=now, timeout=timeout)


def live_workers(s: Session, *, now: datetime, timeout: timedelta | None) -> set[str]:
    """The ids of workers alive now: fresh heartbeats, and on this host a process to match.

    `timeout` None: a stale heartbeat proves nothing now (the store was down or locked,
    so no worker could beat); every worker still registered counts as alive, but for a
    process gone from this host.
    """
    query = select(WorkerRow)
    if timeout is not None:
        query = query.where(col(WorkerRow.heartbeat_at) >= now - timeout)
    rows: Iterable[WorkerRow] = s.exec(query)
    return {row.id for row in rows if _alive(row, now=now, timeout=timeout)}
