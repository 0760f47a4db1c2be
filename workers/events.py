"""Task events for Flower: on from a worker's start while a Flower watches its broker.

Flower turns task events on in running workers with an `enable_events`
broadcast every 5 s, so a worker that started meanwhile ran its first turns
unseen. `relayq flower` therefore keeps a mark on the broker while it runs
(`{prefix}flower`, expiring 30 s after its last renewal), and a worker that
finds it at start sends task events from the first turn on, as
`RELAYQ_TASK_EVENTS=1` makes it do always. A worker sending task events
also sends `task-sent` for the messages it publishes (the next turn, a
retry), so Flower lists a turn from when it was queued; Flower's broadcast
turns both on, and its `disable_events` both off.

A turn that fails says how long it ran (`TimedRequest`), as one that
succeeds does: Celery's `task-failed` event carries no runtime. A turn also
says where it is (`FlowerProgress`, a hook of the worker's runtime): a
`task-progress` event as it calls the model, runs tools of ours, and is saved.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from contextvars import ContextVar
from typing import Any

import redis
from celery import Celery, Task
from celery.signals import worker_ready
from celery.worker import control
from celery.worker.request import Request

from tasks.broker.redis_clients import RedisBounds
from tasks.hooks import ModelCalling, RunHooks, ToolStarting, TurnEnded, TurnOutcome, TurnStarted
from tasks.settings import Settings

__all__ = [
    "FlowerProgress",
    "MARK_TTL",
    "TimedRequest",
    "TimedTask",
    "events_from_start",
    "flower_watching",
    "keep_watch_mark",
]

log = logging.getLogger(__name__)

MARK_TTL = 30
"""Seconds the mark outlives its last renewal (a Flower that died stops renewing it)."""
_RENEW_EVERY = 10.0
_CAPTURE_WAIT = 10.0


def _mark(settings: Settings) -> str:
    return f"{settings.key_prefix}flower"


def _client(settings: Settings) -> redis.Redis | None:
    url = settings.redis_url
    if url is None:
        return None
    return redis.Redis.from_url(url, **RedisBounds.of(settings).options(url))


def flower_watching(settings: Settings) -> bool:
    """Whether a `relayq flower` watches this broker and key prefix (False if it cannot say)."""
    client = _client(settings)
    if client is None:
        return False
    try:
        return bool(client.exists(_mark(settings)))
    except redis.RedisError:
        return False  # a worker starts all the same; Flower's broadcast turns events on
    finally:
        client.close()


def keep_watch_mark(
    settings: Settings, app: Celery, capturing: threading.Event | None = None
) -> threading.Thread | None:
    """In Flower's process: put the mark up (before Flower serves) and renew it until the
    process ends; and tell the workers already running to send task events at once, as
    Flower does only 5 s after it starts.

    `capturing` is set once Flower's receiver has heard its first event (the workers
    answer its wake-up with a heartbeat). Events sent before it listens are lost, so
    the broadcast waits for it, up to `_CAPTURE_WAIT` (a broker without workers sends
    nothing to hear)."""
    client = _client(settings)
    if client is None:
        return None
    me = f"{socket.gethostname()}:{os.getpid()}"

    def put() -> None:
        try:
            client.set(_mark(settings), me, ex=MARK_TTL)
        except redis.RedisError as exc:  # the broker may be away; Flower waits for it too
            log.warning("could not mark the broker as watched: %s", type(exc).__name__)

    def renew() -> None:
        if capturing is not None:
            capturing.wait(_CAPTURE_WAIT)
        try:
            app.control.enable_events()
        except Exception as exc:  # Flower's own broadcast comes 5 s later
            log.warning("could not turn the workers' task events on: %s", type(exc).__name__)
        while True:
            time.sleep(_RENEW_EVERY)
            put()

    put()
    thread = threading.Thread(target=renew, name="relayq-flower-mark", daemon=True)
    thread.start()
    return thread


def events_from_start(app: Celery, settings: Settings) -> None:
    """Before the worker reads its settings (`celeryd_init`): task events, and `task-sent`
    events, from the start when a Flower watches."""
    if not settings.worker.task_events and flower_watching(settings):
        app.conf.update(worker_send_task_events=True, task_send_sent_event=True)


@control.control_command(name="enable_events")
def _enable_events(state: Any) -> Any:
    """Tell worker(s) to send task-related events."""
    # Celery's own command (Flower's broadcast), with `task-sent` events along: a
    # command registered under a taken name replaces the first one.
    state.app.conf.task_send_sent_event = True
    return control.enable_events(state)


@control.control_command(name="disable_events")
def _disable_events(state: Any) -> Any:
    """Tell worker(s) to stop sending task-related events."""
    state.app.conf.task_send_sent_event = False
    return control.disable_events(state)


class TimedRequest(Request):
    """Celery's task request, whose `task-failed` event says how long the task ran.

    Celery internal: the pool's result callback knows the runtime, but hands a
    failure on without it (`Request.on_failure`); Flower shows the runtime of
    `task-succeeded` only. A failure's runtime is counted here from when the
    pool accepted the task (`time_start`, on every pool).
    """

    __slots__ = ()

    def send_event(self, type: str, **fields: Any) -> None:
        if type == "task-failed" and "runtime" not in fields and self.time_start:
            fields["runtime"] = max(time.time() - self.time_start, 0.0)
        super().send_event(type, **fields)


class TimedTask(Task):
    """The base of the worker app's tasks: their requests are `TimedRequest`s."""

    Request = "workers.events:TimedRequest"


# The worker's consumer, whose event dispatcher sends the task events Flower reads.
_worker: dict[str, Any] = {}


@worker_ready.connect
def _keep_consumer(sender: Any = None, **_: Any) -> None:
    _worker["consumer"] = sender


_turn: ContextVar[TurnStarted | None] = ContextVar("relayq_flower_turn", default=None)
_SAVED = frozenset(
    {TurnOutcome.NEXT, TurnOutcome.DONE, TurnOutcome.PENDING, TurnOutcome.INCOMPLETE}
)


class FlowerProgress(RunHooks):
    """`task-progress` events for Flower: ids, the turn number and a phase (`model`,
    `tools`, `saved`), nothing else.

    The worker's own dispatcher (thread-safe) drops task events with one set
    lookup until Flower's `enable_events` broadcast turns them on, so this costs
    nothing meanwhile. Under prefork the turn runs in a child with no consumer:
    no progress events there.
    """

    on_loop = True  # quick, and made for the loop (`RunHooks.on_loop`)

    def before_turn(self, event: TurnStarted) -> None:
        _turn.set(event)

    def before_model_call(self, event: ModelCalling) -> None:
        self._send("model")

    def before_tool(self, event: ToolStarting) -> None:
        self._send("tools")

    def after_turn(self, event: TurnEnded) -> None:
        if event.outcome in _SAVED:
            self._send("saved")
        _turn.set(None)

    @staticmethod
    def _send(phase: str) -> None:
        turn = _turn.get()
        dispatcher = getattr(_worker.get("consumer"), "event_dispatcher", None)
        if turn is None or turn.task_id is None or dispatcher is None:
            return
        try:
            dispatcher.send(
                "task-progress",
                uuid=turn.task_id,
                run=turn.run_id,
                agent=turn.agent,
                turn=turn.turn,
                phase=phase,
            )
        except Exception as exc:  # monitoring must never fail a turn
            log.debug("could not send a progress event: %s", type(exc).__name__)
