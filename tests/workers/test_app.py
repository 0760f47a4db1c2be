"""The worker's exit status (`workers.app`): never 0 when it stopped unasked (issue #9; the
outage itself, on real workers: tests/durable/test_broker_outage.py), Celery's own when a stop
was asked for."""

from __future__ import annotations

import importlib
import threading

import pytest


def test_a_worker_that_ends_with_no_status_unasked_exits_1(monkeypatch: pytest.MonkeyPatch):
    # Celery may end a worker with no status at all (after a WorkerTerminate, say)
    app = _worker_app(monkeypatch, started=True, stop_requested=False)
    assert app.exit_code(None) == 1
    assert app.exit_code(0) == 1
    assert app.exit_code(2) == 2


def test_a_stop_asked_for_exits_with_celerys_own_status(monkeypatch: pytest.MonkeyPatch):
    app = _worker_app(monkeypatch, started=True, stop_requested=True)
    assert app.exit_code(0) == 0  # SIGTERM, or the remote `shutdown`
    assert app.exit_code(1) == 1  # a failing status stays one
    idle = _worker_app(monkeypatch, started=False, stop_requested=False)
    assert idle.exit_code(0) == 0, "no worker ran: `worker --help`, beat, inspect"


def _worker_app(monkeypatch: pytest.MonkeyPatch, *, started: bool, stop_requested: bool):
    # `workers.app` the module: the package's `app` attribute is the Celery app.
    module = importlib.import_module("workers.app")
    for name, value in (("_started", started), ("_stop_requested", stop_requested)):
        event = threading.Event()
        if value:
            event.set()
        monkeypatch.setattr(module, name, event)
    return module
