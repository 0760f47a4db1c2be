"""`relayq flower`: Flower on the workers' broker and key prefix, behind basic auth.

    RELAYQ_FLOWER_AUTH="ops:s3cret,alice:other" relayq flower --host 0.0.0.0 --port 5555

Flower runs in this process, through its own `celery flower` command on
relayq's Celery app, so it reads the same `RELAYQ_*` settings as the workers
(the embedded Redis when `RELAYQ_BROKER_URL` is unset). Without
`RELAYQ_FLOWER_AUTH` it serves only on a loopback address. Credentials reach
Flower in memory, never on a command line or in a log.

Each `relayq.run_turn` shows its label (`run=... agent=... turn=...`) as its
arguments, on the task list too (its `args` column), and the phase of the turn
(`model`, `tools`, `saved`) from the workers' `task-progress` events. While it
runs, a worker that starts sends task events from its first turn on
(`workers.events`).
"""

from __future__ import annotations

import ipaddress
import os
import sys
import threading
from typing import Any

import flower.events  # type: ignore[import-untyped]
from celery.events.state import Task

from workers.app import app, settings
from workers.embedded import ensure_embedded_redis
from workers.events import keep_watch_mark

__all__ = ["FlowerState", "FlowerTask", "credentials", "run"]

AUTH_VARIABLE = "RELAYQ_FLOWER_AUTH"
TASK_COLUMNS = "name,uuid,state,args,received,runtime,worker"
"""The task list's columns: Flower's default, and `args`, where a turn's label is."""


class FlowerTask(Task):
    """A task as Flower keeps it, with the phase its last `task-progress` event gave."""

    phase: str | None = None
    _fields = (*Task._fields, "phase")


class FlowerState(flower.events.EventsState):
    """Flower's state, whose tasks are `FlowerTask`s, and which says when its receiver
    has heard a first event (`capturing`): from then on no event is lost to it."""

    Task = FlowerTask
    capturing = threading.Event()

    def event(self, event: dict[str, Any]) -> Any:
        if not self.capturing.is_set():
            self.capturing.set()
        return super().event(event)


def credentials(value: str) -> list[str]:
    """`user:password` pairs from `RELAYQ_FLOWER_AUTH`, comma-separated.

    >>> credentials("ops:s3cret, alice:other")
    ['ops:s3cret', 'alice:other']
    """
    pairs = [part.strip() for part in value.split(",") if part.strip()]
    for n, pair in enumerate(pairs, 1):
        user, sep, password = pair.partition(":")
        if not (user and sep and password):
            # Names the entry by position only: the value may hold a password.
            raise SystemExit(f"relayq flower: entry {n} of {AUTH_VARIABLE} is not user:password")
    return pairs


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def run(port: int = 5555, address: str = "127.0.0.1") -> None:
    """Serve Flower on `address:port` until SIGTERM or Ctrl-C."""
    auth = credentials(os.environ.get(AUTH_VARIABLE, ""))
    if not auth and not _loopback(address):
        raise SystemExit(
            f"relayq flower: set {AUTH_VARIABLE}=user:password to serve on "
            f"{address or 'every address'}; without it Flower serves only on a loopback address"
        )
    if not auth:
        print(
            f"relayq flower: WARNING: no {AUTH_VARIABLE}, so anyone on this machine can use "
            f"Flower on {address}:{port}",
            file=sys.stderr,
            flush=True,
        )
    if settings.embedded_broker:
        ensure_embedded_redis(settings)
    # Flower builds its state from the class its module names: ours keeps the phase
    # on display and tells the mark's thread when the receiver listens.
    flower.events.EventsState = FlowerState
    keep_watch_mark(settings, app, FlowerState.capturing)
    argv = ["flower", f"--port={port}", f"--address={address}"]
    if not os.environ.get("FLOWER_TASKS_COLUMNS"):  # Flower's own setting wins
        argv.append(f"--tasks_columns={TASK_COLUMNS}")
    if auth:
        argv.append("--basic-auth=" + ",".join(auth))
    app.start(argv=argv)
