"""This process's provider circuits (`circuit_for`), the hooks told of their changes
(`add_hooks`; `CircuitLog` logs each), and the waker that sends the runs that waited on
a circuit just closed on their way again (`relayq.wake_runs` messages).

The circuit kept in Redis, shared by every worker, is `tasks.broker.redis_circuit`'s (the
always-closed base and the hooks' events: `relayq.circuit`); the circuits as read for
people (/metrics, `relayq batch status`) are `tasks.broker.circuit_views`'. The names of both
modules that the rest of relayq uses are importable from here too.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading

from relayq.circuit import Circuit, CircuitChange, CircuitHooks, circuit_hooks
from store.outbox import MAINTENANCE_QUEUE, WAKE_TASK
from tasks.broker.circuit_views import CircuitView, batch_waits, read_circuits, since_text
from tasks.broker.redis_circuit import REFRESH, RedisCircuit, Wake
from tasks.broker.redis_clients import RedisBounds
from tasks.settings import Settings

__all__ = [
    "REFRESH",
    "WAKE_TASK",
    "CircuitLog",
    "CircuitView",
    "RedisCircuit",
    "add_hooks",
    "batch_waits",
    "circuit_for",
    "read_circuits",
    "since_text",
]

log = logging.getLogger(__name__)

_WAKE_CHUNK = 500
"""Run ids per wake message."""
_WAKE_EXPIRES = 300.0
"""Seconds a wake-up message is worth delivering: past them, the countdowns do as well."""


class CircuitLog(CircuitHooks):
    """One line per change this process sees: opened, probed (and the probe failed), closed."""

    def after_change(self, event: CircuitChange) -> None:
        since = since_text(event.opened_at) if event.opened_at else "?"
        if event.probe_failed:
            log.info(
                "provider %s: the probe failed (%s); circuit open since %s",
                event.provider,
                event.kind or "outage",
                since,
            )
        elif event.state == "open":
            log.warning(
                "provider %s is down (%s): circuit open since %s; its turns wait without "
                "spending tries",
                event.provider,
                event.kind or "outage",
                since,
            )
        elif event.state == "half_open":
            log.info("provider %s: circuit half-open, this worker probes it", event.provider)
        else:
            log.warning(
                "provider %s answers again: circuit closed (open since %s), %d waiting runs woken",
                event.provider,
                since,
                event.woken,
            )


_HOOKS = circuit_hooks([CircuitLog()])
_circuits: dict[tuple[int, str, str, bool], Circuit] = {}
_lock = threading.Lock()


def add_hooks(hooks: CircuitHooks) -> None:
    """Tell `hooks` of every circuit change this process sees."""
    _HOOKS.add(hooks)


def _waker(settings: Settings) -> Wake:
    """Send the woken runs to a worker in `relayq.wake_runs` messages (maintenance queue)."""
    from tasks.broker.publish import sender_app

    sender = sender_app(settings)

    def send(runs: list[str]) -> None:
        for start in range(0, len(runs), _WAKE_CHUNK):
            chunk = runs[start : start + _WAKE_CHUNK]
            # Expiring: with no worker on the queue (an eager host's broker) it is dropped
            # unread, and the runs' countdowns bring them back.
            sender.send_task(
                WAKE_TASK, args=[chunk], queue=MAINTENANCE_QUEUE, expires=_WAKE_EXPIRES
            )

    async def wake(runs: list[str]) -> None:
        await asyncio.to_thread(send, runs)

    return wake


def circuit_for(settings: Settings) -> Circuit:
    """This process's circuits: on the broker's Redis, under the settings' key prefix; the
    always-closed base when the broker is not Redis or RELAYQ_PROVIDER_CIRCUIT is off."""
    key = (os.getpid(), settings.broker_url, settings.key_prefix, settings.providers.circuit)
    with _lock:
        circuit = _circuits.get(key)
        if circuit is None:
            url = settings.redis_url
            # An embedded broker no process has started: nothing to share a circuit with.
            unstarted = settings.embedded_broker and not settings.socket_path.exists()
            if url is None or unstarted or not settings.providers.circuit:
                circuit = Circuit(_HOOKS)
            else:
                circuit = RedisCircuit(
                    url,
                    prefix=settings.key_prefix,
                    probe_every=settings.providers.probe_every.total_seconds(),
                    hooks=_HOOKS,
                    wake=_waker(settings),
                    bounds=RedisBounds.of(settings),
                )
            _circuits[key] = circuit
        return circuit
