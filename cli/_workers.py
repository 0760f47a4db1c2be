"""Which workers consume a queue, as the workers themselves answer over the broker.

`relayq run` (and `relayq batch`) ask it while their runs wait, so that a run
no worker will ever take is said to be so within seconds, not waited on in
silence. Celery's own broadcast (`inspect().active_queues()`) answers for
every worker on the broker and key prefix, whatever started it; the store's
heartbeats (`store.workers`) tell a worker that did not answer (busy, or on
another broker or prefix) from no worker at all. For a batch's turns, which
wait in the batch's own queue (`store.batch_queues`), each worker is asked
instead which queues' batches it takes (`workers.batch_queues`): one started
with `RELAYQ_WORKER_BATCHES=skip` takes none.
"""

from __future__ import annotations

from dataclasses import dataclass

from relayq.agents import DEFAULT_QUEUE, registered_agents
from store import Database
from store.models import utcnow
from store.workers import live_workers
from tasks.broker.publish import sender_app
from tasks.settings import Settings

__all__ = ["Serving", "ping_broker", "queue_of", "workers_on"]

CONNECT_TIMEOUT = 5.0
"""Seconds to reach the broker before it counts as down."""


@dataclass(frozen=True, kw_only=True)
class Serving:
    """Who consumes a queue, as the workers answered one broadcast."""

    queue: str
    batches: bool = False
    """Asked about the batch turns of `queue` (they go to each batch's own queue)."""
    consumers: tuple[str, ...] = ()
    """Workers (Celery node names, `celery@host`) that consume `queue` (or its batches')."""
    others: tuple[str, ...] = ()
    """Workers that answered but consume other queues only."""
    beating: int = 0
    """Worker processes whose heartbeat in the store is fresh (0 when the store was not asked)."""

    @property
    def served(self) -> bool:
        return bool(self.consumers)

    @property
    def unsure(self) -> bool:
        """No worker answered, yet some beat in the store: busy, or on another broker or prefix."""
        return not self.consumers and not self.others and self.beating > 0


def queue_of(agent: str) -> str:
    """The queue `agent`'s turns go to (its own `Agent(queue=...)`, else relayq's turn queue)."""
    known = registered_agents().get(agent)
    return known.queue if known is not None else DEFAULT_QUEUE


def ping_broker(settings: Settings) -> None:
    """Return once the broker answers; kombu's OperationalError (or OSError) if it does not."""
    app = sender_app(settings)
    try:
        with app.connection_for_write() as conn:
            _connect(conn)
    finally:
        app.close()


def workers_on(
    settings: Settings,
    queue: str,
    *,
    db: Database | None = None,
    timeout: float = 1.0,
    batches: bool = False,
) -> Serving:
    """Ask every worker on the broker which queues it consumes (with `batches`: whose
    batches' queues it consumes); takes `timeout` seconds.

    With `db`, also count the worker processes beating in the store. Raises
    kombu's OperationalError (or OSError) when the broker does not answer.
    """
    app = sender_app(settings)
    try:
        with app.connection_for_write() as conn:
            _connect(conn)
            if batches:
                answers = app.control.broadcast(
                    "relayq_batch_queues", reply=True, timeout=timeout, connection=conn
                )
                replies = {name: _batch_bases(r) for a in answers or [] for name, r in a.items()}
            else:
                found = app.control.inspect(timeout=timeout, connection=conn).active_queues()
                replies = {
                    name: [str(q.get("name")) for q in queues or []]
                    for name, queues in (found or {}).items()
                }
    finally:
        app.close()
    consuming = {name for name, queues in replies.items() if queue in queues}
    return Serving(
        queue=queue,
        batches=batches,
        consumers=tuple(sorted(consuming)),
        others=tuple(sorted(set(replies) - consuming)),
        beating=0 if db is None else _beating(db, settings),
    )


def _batch_bases(reply: object) -> list[str]:
    """The queues whose batches a worker takes, from its `relayq_batch_queues` reply."""
    if not isinstance(reply, dict):  # not a worker of ours: an error, not an answer
        return []
    return [str(q) for q in reply.get("queues") or []]


def _connect(conn: object) -> None:
    # One quick try, not kombu's default of retrying for ever.
    conn.ensure_connection(  # type: ignore[attr-defined]
        max_retries=1, interval_start=0, interval_step=0, timeout=CONNECT_TIMEOUT
    )


def _beating(db: Database, settings: Settings) -> int:
    with db.read() as s:
        return len(live_workers(s, now=utcnow(), timeout=settings.recovery.worker_timeout))
