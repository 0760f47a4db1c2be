"""How long a worker's consumer has gone without hearing its broker, as a metric.

A consumer on Redis always has a BRPOP waiting, and a live server answers it within
its timeout (1 s), empty-handed if need be; kombu sends the next as soon as one is
answered, and keeps when (`_brpop_sent_at`, monotonic). So the time since the last
BRPOP went out is the time since the broker was last heard. A consumer reconnecting hears
nothing at all, and one paused on a full pool asks nothing and counts as hearing.
Every second, from a thread of its own, `BrokerHeard` sets
`relayq_broker_unheard_seconds` to it: a value that climbs past
`RELAYQ_BROKER_HEALTH_CHECK` is a broker gone silent, which kombu's check drops and the
consumer makes again (docs/operators.md).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import bootsteps

from tasks.observability.metrics import observe_broker_unheard

__all__ = ["BrokerHeard", "heard_at"]

EVERY = 1.0
"""Seconds between two looks."""

log = logging.getLogger(__name__)


def heard_at(consumer: Any, now: float) -> float | None:
    """When `consumer` (a Celery consumer) last heard its broker, as `time.monotonic()`
    counts; None when it is not connected."""
    connection = getattr(consumer, "connection", None)
    task_consumer = getattr(consumer, "task_consumer", None)
    if connection is None or task_consumer is None or not connection.connected:
        return None
    channel = getattr(task_consumer, "channel", None)
    sent = getattr(channel, "_brpop_sent_at", None)
    if sent is None:
        return now  # no BRPOP sent yet, or a transport with none
    qos = getattr(channel, "qos", None)
    if qos is not None and not qos.can_consume():
        return now  # its pool is full: it reads no reply until a turn ends
    # Whether one is pending or kombu dropped its connection for silent (the next goes out
    # once a new one answers), the last was sent when the one before was answered.
    return float(sent)


class BrokerHeard(bootsteps.StartStopStep):
    """The consumer's `relayq_broker_unheard_seconds`, each second, for the worker's life.

    From a thread of its own: the consumer's own loop may be the one held up by the silent
    broker (a command waiting out its socket timeout), and the metric must go on counting
    then above all."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        url = parent.app.conf.broker_url or "memory://"
        self.broker = url.split(":", 1)[0]
        """The broker's scheme (`redis`, `amqp`): the metric's label, never its address."""
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, parent: Any) -> None:
        # Called again after every reconnection: one thread for the consumer's life.
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._watch, args=(parent,), name="relayq-broker-heard", daemon=True
            )
            self._thread.start()

    def _watch(self, parent: Any) -> None:
        while not self._stop.wait(EVERY):
            try:
                self.observe(parent)
            except Exception:  # a consumer between two states; the next look reads it again
                log.debug("could not read the consumer's state", exc_info=True)

    def observe(self, parent: Any) -> float:
        now = time.monotonic()
        heard = heard_at(parent, now)
        if heard is not None:
            self._last = max(self._last, heard)
        unheard = now - self._last
        observe_broker_unheard(unheard, broker=self.broker)
        return unheard

    def shutdown(self, parent: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
