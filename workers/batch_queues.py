"""A worker consumes the queues of the active batches of the queues it is told to consume.

Each batch's turns wait in a queue of their own (`store.batch_queues`), named
when the batch starts, so no worker can be told its name in advance. A thread
of the worker's main process reads the active batches' queues from the store
every `RELAYQ_BATCH_POLL` seconds; the consumer's own thread then starts
consuming the new ones and stops consuming those whose batch has finished, as
Celery's `add_consumer` and `cancel_consumer` remote commands do. A host that starts a
batch broadcasts `relayq_batches_changed`, and the thread looks at once. Both change
the worker's selection of queues (`app.amqp.queues.consume_from`), from which
Celery builds its task consumer again after a lost broker connection: the
batch queues are consumed again on reconnection without more ado.

`RELAYQ_WORKER_BATCHES` (`tasks.settings`) says which, for the queues `-Q` names:

    serve   those queues and their batches' (the default)
    skip    those queues only: an interactive-only worker
    only    their batches' only, not the queues themselves: a batch worker

A store that cannot be read is logged and read again at the next poll; the
queues consumed meanwhile stay as they were. The `relayq_batch_queues` inspect
command tells `relayq batch` which workers take batch turns.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import bootsteps
from celery.worker.control import control_command, inspect_command

from store import Database, migrate
from store.batch_queues import active_batch_queues, is_batch_queue, is_batch_queue_of
from tasks.settings import Settings, queue_named
from workers.forks import no_fork_meanwhile

__all__ = ["BatchQueues"]

log = logging.getLogger(__name__)


class BatchQueues(bootsteps.StartStopStep):
    """The consumer's batch queues, kept to the store's active batches."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.settings = Settings.load(conf=parent.app.conf)
        self.mode = self.settings.worker.batches
        queues = parent.app.amqp.queues
        self.bases = tuple(name for name in queues.consume_from if not is_batch_queue(name))
        """The queues `-Q` named: the agents' queues whose batches this worker may take."""
        if self.mode == "only":
            # Celery has selected them already (its queues come before the consumer), and
            # builds its task consumer from what is selected when it starts.
            queues.deselect(list(self.bases))
        self._stop = threading.Event()
        self._look = threading.Event()
        """Set to look at the store now: a batch has started (`relayq_batches_changed`)."""
        self._thread: threading.Thread | None = None
        self._db: Database | None = None

    @classmethod
    def of(cls, consumer: Any) -> BatchQueues | None:
        """The step of `consumer` (a Celery consumer), if it has one."""
        return next((step for step in consumer.steps if isinstance(step, cls)), None)

    def start(self, parent: Any) -> None:
        # Called again after every reconnection: the thread outlives the connections.
        if self.mode == "skip" or self._thread is not None:
            return
        log.info(
            "consuming %s the active batches' queues of %s (RELAYQ_WORKER_BATCHES=%s), "
            "looking every %g s",
            "only" if self.mode == "only" else "also",
            ", ".join(self.bases) or "no queue",
            self.mode,
            self.settings.worker.batch_poll.total_seconds(),
        )
        self._thread = threading.Thread(
            target=self._poll, args=(parent,), name="relayq-batch-queues", daemon=True
        )
        self._thread.start()

    def shutdown(self, parent: Any) -> None:
        self._stop.set()
        self._look.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._db is not None:
            self._db.dispose()

    def consumed(self, parent: Any) -> list[str]:
        """The batch queues the consumer consumes now."""
        return sorted(name for name in parent.app.amqp.queues.consume_from if self.mine(name))

    def mine(self, queue: str) -> bool:
        """Whether `queue` is the queue of a batch of one of this worker's queues."""
        return any(is_batch_queue_of(base, queue) for base in self.bases)

    def _poll(self, parent: Any) -> None:
        """The thread: what the store says, handed to the consumer's thread."""
        while True:
            try:
                wanted = self.active()
            except Exception as exc:
                log.warning(
                    "could not read the active batches (again in %g s): %s: %s",
                    self.settings.worker.batch_poll.total_seconds(),
                    type(exc).__name__,
                    str(exc).splitlines()[0] if str(exc) else "",
                )
            else:
                # Celery's consumer is not thread-safe: its event loop runs this (the
                # hub's `call_soon` wakes it), as it runs the remote-control commands.
                parent.call_soon(self._follow, parent, wanted)
            self._look.wait(self.settings.worker.batch_poll.total_seconds())
            self._look.clear()
            if self._stop.is_set():
                return

    def active(self) -> set[str]:
        """The queues of the store's active batches under this worker's queues, read with
        no fork of this process meanwhile (`workers.forks`): a prefork pool's child forked
        while this thread is inside the store's library would hang."""
        with no_fork_meanwhile():
            return set(active_batch_queues(self._database(), under=self.bases))

    def look_now(self) -> None:
        """Look at the store's active batches now rather than at the next poll."""
        self._look.set()

    def _database(self) -> Database:
        if self._db is None:
            db = Database(self.settings.database_url)
            try:
                # A prefork worker's main process may be the first to open a new store.
                migrate(db)
            except Exception:
                db.dispose()
                raise
            # A prefork child forked later (one replacing another) must not share, nor
            # close, this process's connections.
            os.register_at_fork(after_in_child=lambda: db.engine.dispose(close=False))
            self._db = db
        return self._db

    def _follow(self, parent: Any, wanted: set[str]) -> None:
        """On the consumer's thread: consume the batch queues in `wanted`, and no others."""
        queues = parent.app.amqp.queues
        consumed = set(self.consumed(parent))
        for name in sorted(wanted - consumed):
            if name not in queues:
                queues.add(queue_named(name))
            try:
                parent.add_task_queue(name)
            except Exception as exc:
                # Selected all the same: the consumer takes it up when it starts again.
                log.warning("could not consume queue %s yet: %r", name, exc)
        for name in sorted(consumed - wanted):
            try:
                parent.cancel_task_queue(name)
            except Exception as exc:
                log.warning("could not stop consuming queue %s: %r", name, exc)
            queue = queues.pop(name, None)  # a worker that runs for months meets many batches
            _delete(parent, queue or queue_named(name))


def _delete(parent: Any, queue: Any) -> None:
    """The finished batch's queue off the broker, with its exchange's bindings (kombu's
    Redis transport keeps two keys a queue, which outlive it): each worker that served it
    deletes it once it stops; what was left in it is no run's any more (the batch ended),
    and a batch run again declares it anew."""
    try:
        queue.bind(parent.connection.default_channel).delete()
    except Exception as exc:
        log.info("could not delete finished queue %s: %s", queue.name, type(exc).__name__)


@control_command(name="relayq_batches_changed")
def batches_changed(state: Any, **_: Any) -> dict[str, Any]:
    """A batch has new runs (`tasks.broker.publish.batches_changed`): look at the store now, so its
    first turns need not wait for the next poll."""
    step = BatchQueues.of(state.consumer)
    if step is not None and step.mode != "skip":
        step.look_now()
    return {"ok": "looking"}


@inspect_command(name="relayq_batch_queues")
def batch_queues(state: Any, **_: Any) -> dict[str, Any]:
    """The queues whose batches this worker takes, and the batch queues it consumes now."""
    step = BatchQueues.of(state.consumer)
    if step is None:
        return {"mode": "skip", "queues": [], "consuming": []}
    serves = [] if step.mode == "skip" else list(step.bases)
    return {"mode": step.mode, "queues": serves, "consuming": step.consumed(state.consumer)}
