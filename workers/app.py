"""The Celery app: `celery -A workers worker` runs relayq's tasks.

Configuration comes from the environment and, below it, from a Celery
config module (`CELERY_CONFIG_MODULE=myconfig`, with `relayq_*` settings;
see `tasks.settings` and `workers.config`). With no broker URL, the worker
and beat start the embedded Redis before they connect.

`-Q` picks the queues a worker consumes (by default relayq's three); a queue
it names that relayq does not declare (an agent's own, `Agent(queue=...)`) is
declared like relayq's: on an exchange of its own, bound by its name. The
queues of those queues' active batches are consumed too, or instead, or never
(`RELAYQ_WORKER_BATCHES`, `workers.batch_queues`).

A worker rides out a broker outage of any length: it reconnects and goes on
consuming (`Consumer`). If it stops without being asked to (SIGTERM, SIGINT,
Celery's remote `shutdown`), it exits non-zero (`exit_code`), so a supervisor
that restarts only failed processes brings it back.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery
from celery.signals import (
    after_setup_logger,
    beat_init,
    celeryd_after_setup,
    celeryd_init,
    worker_init,
    worker_shutdown,
    worker_shutting_down,
)
from celery.worker import consumer, control

from relayq.agents import load_agents, registered_agents
from tasks.settings import Settings, queue_named
from workers.batch_queues import BatchQueues
from workers.broker_heard import BrokerHeard
from workers.config import celery_config
from workers.doorbell import doorbell_for
from workers.embedded import ensure_embedded_redis
from workers.events import events_from_start
from workers.malformed import malformed_message
from workers.metrics import install as install_metrics

__all__ = ["Consumer", "app", "exit_code", "settings"]

log = logging.getLogger(__name__)

# Its tasks' requests give a failed task's runtime to Flower (`workers.events`).
app = Celery("relayq", task_cls="workers.events:TimedTask")
# Reading the configuration loads the config module (Celery's CELERY_CONFIG_MODULE)
# if one is named; relayq's own Celery settings then go on top of it.
settings = Settings.load(conf=app.conf)
app.conf.update(celery_config(settings))
install_metrics(app)  # served when RELAYQ_WORKER_METRICS_PORT is set (`workers.metrics`)
app.steps["consumer"].add(BatchQueues)
app.steps["consumer"].add(BrokerHeard)

_started = threading.Event()
_stop_requested = threading.Event()


@celeryd_init.connect
def _declare_queues(options: dict[str, Any] | None = None, **_: Any) -> None:
    """Declare each queue `-Q` names, before the worker selects them."""
    queues = (options or {}).get("queues") or []
    names = queues.split(",") if isinstance(queues, str) else list(queues)
    declared = app.amqp.queues
    for name in (n.strip() for n in names):
        if name and name not in declared:
            declared.add(queue_named(name))


@celeryd_init.connect
def _events_for_flower(**_: Any) -> None:
    """Task events from the start while a Flower watches (before the worker reads them)."""
    events_from_start(app, settings)


@worker_init.connect
def _prepare_worker(**_: Any) -> None:
    _started.set()
    if settings.embedded_broker:
        ensure_embedded_redis(settings)
    # Fail at start, not at the first turn, when an agent module is broken or an
    # agent's policy does not fit this worker.
    if settings.agents:
        load_agents(settings.agents)
    for agent in registered_agents().values():
        settings.check_agent(agent)


@celeryd_after_setup.connect
def _note_unserved_queues(instance: Any = None, **_: Any) -> None:
    """Say which agents' turns this worker leaves to others (once `-Q` applied and logs work)."""
    if settings.worker.batches == "only":
        return  # a batch worker leaves every interactive turn to others; it says so at start
    queues = getattr(instance, "app", app).amqp.queues
    consumed = queues.consume_from or queues  # no selection: every declared queue
    for agent in registered_agents().values():
        if agent.queue not in consumed:
            log.info(
                "agent %r sends its turns to queue %s, which this worker does not consume",
                agent.name,
                agent.queue,
            )


@after_setup_logger.connect
def _quiet_task_lines(**_: Any) -> None:
    """`RELAYQ_TASK_LOG=0`: no INFO line per task received and per task finished."""
    if not settings.worker.task_log:
        for name in TASK_LINE_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


TASK_LINE_LOGGERS = ("celery.worker.strategy", "celery.app.trace")
"""Where Celery logs `Task ...[id] received` and `Task ...[id] succeeded in ...`."""


@beat_init.connect
def _prepare_beat(**_: Any) -> None:
    if settings.embedded_broker:
        ensure_embedded_redis(settings)


RECONNECT = {"interval_start": 1.0, "interval_step": 1.0, "interval_max": 2.0}
"""Seconds between tries to reach a lost broker: never more than 2."""


class Consumer(consumer.Consumer):
    """Celery's consumer, made to survive releasing a broker connection it has lost.

    Celery 5.7 (`Consumer.on_connection_error_after_connected`) releases the
    lost connection with `collect()`, then `close()`. On kombu's Redis
    transport, when the channel was waiting in BRPOP and held unacknowledged
    messages (any turn in flight, with a free slot left), the first close
    fails at the dead socket, `collect()` drops the transport's client all the
    same, and the second close, restoring the unacknowledged messages, needs
    that client: `AttributeError: 'NoneType' object has no attribute
    'hostname'`, which nothing catches, and the worker stops. Nothing can be
    saved on a lost connection, so errors while releasing it are logged and
    ignored; Celery then cancels the tasks that can no longer be acknowledged
    and reconnects as usual.
    """

    connection: Any

    def ensure_connected(self, conn: Any) -> Any:
        # Celery internal: `Consumer.connect` calls this with a kombu `Connection`
        # and lets it retry with kombu's default backoff, up to 30 s between
        # tries: a broker back after a long outage would wait that long for its
        # consumers, past relayq's 30 s recovery bound. Try every 2 s at most.
        retry = conn.ensure_connection

        def often(*args: Any, **kwargs: Any) -> Any:
            return retry(*args, **{**RECONNECT, **kwargs})

        conn.ensure_connection = often
        doorbell_for(conn)
        return super().ensure_connected(conn)

    # A message the consumer cannot read as a task is dropped, logged without its
    # content (`workers.malformed`); Celery's own handlers log its body, and what they
    # do not catch stops the worker.

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Any:
        handle = super().create_task_handler(*args, **kwargs)

        def on_task_received(message: Any) -> None:
            try:
                handle(message)
            except Exception as exc:
                self._drop(message, exc)

        return on_task_received

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self._drop(message, None)

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._drop(message, exc)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._drop(message, exc)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        self._drop(message, exc)

    def _drop(self, message: Any, exc: Exception | None) -> None:
        headers = getattr(message, "headers", None)
        task = headers.get("task") if isinstance(headers, dict) else None
        queue = (getattr(message, "delivery_info", None) or {}).get("routing_key")
        named = str(task)[:100] if task else None
        malformed_message(f"queue {queue}" if queue else "a queue", exc, named)
        try:
            message.reject(requeue=False)
        except Exception as failed:  # already acknowledged, or its channel gone
            log.info("a dropped message could not be rejected: %s", type(failed).__name__)

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        # Celery internal: `Consumer.start` calls this once a connected consumer
        # lost its broker; it releases `self.connection` through `collect` and
        # `close`, which the wrapper makes safe.
        if self.connection is not None:
            self.connection = _LostConnection(self.connection)
        super().on_connection_error_after_connected(exc)


class _LostConnection:
    """A kombu `Connection` whose `collect` and `close` never raise.

    Everything else is the connection's own (Celery also reads its `transport`
    and `_connection` to bound the open sockets).
    """

    def __init__(self, connection: Any) -> None:
        self._lost = connection

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lost, name)

    def collect(self, *args: Any, **kwargs: Any) -> None:
        self._quietly("collect", *args, **kwargs)

    def close(self) -> None:
        self._quietly("close")

    release = close

    def _quietly(self, method: str, *args: Any, **kwargs: Any) -> None:
        try:
            getattr(self._lost, method)(*args, **kwargs)
        except Exception as exc:
            log.info("the lost broker connection did not %s cleanly: %r", method, exc)


@worker_shutting_down.connect
def _signalled(**_: Any) -> None:
    # Celery sends it from its SIGTERM, SIGINT and SIGQUIT handlers.
    _stop_requested.set()


@control.control_command(name="shutdown")
def _remote_shutdown(state: Any, msg: str = "Got shutdown from remote", **kwargs: Any) -> Any:
    """Shutdown worker(s)."""
    # Celery's own remote command (Flower's "Shut Down"), noted as a requested
    # stop: a command registered under a taken name replaces the first one.
    _stop_requested.set()
    return control.shutdown(state, msg=msg, **kwargs)


@worker_shutdown.connect
def _fail_unrequested_stop(sender: Any = None, **_: Any) -> None:
    # Celery internal: `celery worker` exits with `WorkController.exitcode`,
    # read after `stop` sent this signal; None or 0 with no stop asked for is 1.
    if sender is not None and not sender.exitcode and not _stop_requested.is_set():
        log.critical("the worker stopped without being asked to; exiting with status 1")
        sender.exitcode = 1


def exit_code(code: int | None) -> int:
    """The status a worker process exits with, given what `app.start` returned.

    Celery's `app.start` returns the worker's status instead of exiting with it;
    a worker that stopped on its own (not by a signal or remote `shutdown`) fails.
    """
    if code:
        return int(code)
    if _started.is_set() and not _stop_requested.is_set():
        log.critical("the worker stopped without being asked to; exiting with status 1")
        return 1
    return 0
