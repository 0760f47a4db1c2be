"""A worker's metrics over HTTP, opt-in: `RELAYQ_WORKER_METRICS_PORT=9808` (and
`RELAYQ_WORKER_METRICS_ADDR`, `0.0.0.0` by default) serves `tasks.observability.metrics`'s series
(turns, model calls, tokens, cost, provider limits) at `http://<addr>:<port>/metrics`,
from the worker's main process, without a token.

Under prefork the turns run in child processes, whose counts the main process
cannot see in its memory, and `-P prefork` on the command line is known only after
the task modules are imported. So whatever the pool, prometheus_client's
multiprocess mode keeps each process's counts in files of a folder made for the
worker (`PROMETHEUS_MULTIPROC_DIR`, unless the environment names one already),
summed at each scrape, those of a child that has exited included, beside the main
process's CPU and memory. The folder is set before the task modules are imported
(Celery's `import_modules` signal), and removed when the worker exits. Celery's
command line has imported prometheus_client by then (Flower's plugin does), so
its choice of value store, made at its import, is made again: every series
relayq observes has labels, and its values are made at the first observation,
after this.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

from celery import Celery
from celery.signals import import_modules, worker_ready, worker_shutdown

__all__ = ["ADDR_ENV", "MULTIPROC_ENV", "PORT_ENV", "install", "metrics_port"]

PORT_ENV = "RELAYQ_WORKER_METRICS_PORT"
ADDR_ENV = "RELAYQ_WORKER_METRICS_ADDR"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

log = logging.getLogger(__name__)

_server: list[Any] = []


def metrics_port(env: Mapping[str, str], conf: Mapping[str, Any]) -> int | None:
    """The port from `RELAYQ_WORKER_METRICS_PORT`, else the configuration's
    `relayq_worker_metrics_port`; None: no metrics server. ValueError when it is no port."""
    raw: Any = env.get(PORT_ENV) or conf.get("relayq_worker_metrics_port")
    if raw in (None, ""):
        return None
    try:
        port = int(raw)
    except (TypeError, ValueError):
        port = -1
    if isinstance(raw, bool) or not 0 < port < 65536:
        raise ValueError(f"{PORT_ENV} must be a port number (1 to 65535), not {raw!r}")
    return port


def install(app: Celery) -> None:
    """Serve the worker's metrics when a port is configured (see the module's docstring)."""

    def prepare(sender: Any = None, **_: Any) -> None:
        if metrics_port(os.environ, app.conf) is not None:
            _multiprocess_folder()

    def serve(sender: Any = None, **_: Any) -> None:
        port = metrics_port(os.environ, app.conf)
        if port is not None:
            _serve(port, os.environ.get(ADDR_ENV) or "0.0.0.0")

    def stop(**_: Any) -> None:
        while _server:
            server = _server.pop()
            server.shutdown()
            server.server_close()

    import_modules.connect(prepare, sender=app, weak=False)
    worker_ready.connect(serve, weak=False)
    worker_shutdown.connect(stop, weak=False)


def _multiprocess_folder() -> None:
    """Before prometheus_client is imported: a folder for every process's counts."""
    if not os.environ.get(MULTIPROC_ENV):
        folder = tempfile.mkdtemp(prefix="relayq-metrics-")
        os.environ[MULTIPROC_ENV] = folder
        owner = os.getpid()

        def remove() -> None:
            if os.getpid() == owner:  # not a forked child's exit
                shutil.rmtree(folder, ignore_errors=True)

        atexit.register(remove)
    if "prometheus_client.values" in sys.modules:
        from prometheus_client import values

        # prometheus_client chose its value store when imported; choose again, now that
        # the folder is set. The metrics made from here on keep their counts there.
        values.ValueClass = values.get_value_class()


def _serve(port: int, addr: str) -> None:
    from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.process_collector import ProcessCollector

    registry = REGISTRY
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        ProcessCollector(registry=registry)  # the main process's own CPU and memory
    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        # Metrics never stop a worker: another process may hold the port.
        log.error("could not serve worker metrics on %s:%d: %s", addr, port, exc)
        return
    _server.append(server)
    folder = os.environ.get(MULTIPROC_ENV)
    shared = f", every process's counts in {folder}" if folder else ""
    log.info("worker metrics at http://%s:%d/metrics%s", addr, port, shared)
