"""The worker process's one runtime, with its background work running.

A task body asks for it (`current_runtime`); the first ask in a process builds it from
the worker's app (`Runtime.of_app`) and starts its housekeeping (`Housekeeping.start`):
its heartbeat is written before the body goes on, so no claim of this process is ever
seen without one. A forked child builds its own.
"""

from __future__ import annotations

import os
import threading

from celery import Celery, current_app

from tasks.runner.housekeeping import Housekeeping
from tasks.runner.runtime import Runtime

__all__ = ["current_housekeeping", "current_runtime"]

_lock = threading.Lock()
_current: tuple[int, Runtime, Housekeeping] | None = None


def _process(app: Celery | None) -> tuple[Runtime, Housekeeping]:
    global _current
    with _lock:
        if _current is None or _current[0] != os.getpid():
            rt = Runtime.of_app(app or current_app)
            _current = (os.getpid(), rt, Housekeeping(rt))
        _, rt, housekeeping = _current
        if app is not None:
            rt.app = app
        housekeeping.start()
        return rt, housekeeping


def current_runtime(app: Celery | None = None) -> Runtime:
    """The worker process's runtime, with its heartbeat, sweeps and deliveries running.

    Its settings come from the environment and the configuration of `app`
    (else Celery's current app: the worker's), as `Settings.load` reads them.
    """
    return _process(app)[0]


def current_housekeeping(app: Celery | None = None) -> Housekeeping:
    """The worker process's background work (`current_runtime`'s), to sweep on demand."""
    return _process(app)[1]
