"""Announcing runs that may have settled, so hosts waiting on them wake at once.

A worker's task commits a run's new state to the store, then returns; Celery's
`task_postrun` signal then fires (on every pool: under the asyncio pool once
the turn's coroutine has ended). Here that signal publishes the run's id on a
Redis pub/sub channel named with the settings' key prefix, `<prefix>runs`; a
waiting `DurableClient` (`tasks.waiting`) is subscribed there and reads the
run's status from the store. An announcement carries ids only (space-separated
in one message), never a prompt, a result or a secret: the store is the only
source of truth, and whoever reads the channel learns only that a run moved.

Announcing is best effort, and must not slow a task: one connection per
process, reused; one short try (reconnecting once, for a connection the server
closed); after a failure, silence for a few seconds.
A lost announcement costs a waiter its fallback poll, never its result.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import redis
from celery.signals import task_postrun
from redis.backoff import NoBackoff
from redis.retry import Retry

from store import get_request
from store.outbox import ANSWER_TASK, CANCEL_TASK, TURN_TASK
from tasks.broker import redis_url
from tasks.settings import Settings

__all__ = ["Announcer", "channel_of", "decode", "encode", "runs_moved"]

log = logging.getLogger(__name__)

QUIET_AFTER_FAILURE = 5.0
"""Seconds without trying again once a publish failed (the broker is likely down)."""
TIMEOUT = 0.25
"""Seconds one publish may take, connecting included."""


def channel_of(settings: Settings) -> str:
    """The channel runs are announced on: the key prefix keeps deployments sharing a
    Redis apart (pub/sub channels ignore the db number)."""
    return f"{settings.key_prefix}runs"


def encode(run_ids: Iterable[str]) -> str:
    return " ".join(run_ids)


def decode(data: bytes | str) -> list[str]:
    """The run ids of one announcement."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    return text.split()


class Announcer:
    """Publishes run ids from one process: one connection, one try, quiet after a failure.

    Never raises; a failure is logged at debug level.
    """

    def __init__(self, settings: Settings) -> None:
        self.channel = channel_of(settings)
        url = redis_url(settings)
        self._client = (
            None
            if url is None
            else redis.Redis.from_url(
                url,
                socket_timeout=TIMEOUT,
                socket_connect_timeout=TIMEOUT,
                # One reconnection, for a connection the server closed since its last use.
                retry=Retry(NoBackoff(), 1),
            )
        )
        self._quiet_until = 0.0

    def announce(self, run_ids: Sequence[str]) -> None:
        if self._client is None or not run_ids or time.monotonic() < self._quiet_until:
            return
        try:
            self._client.publish(self.channel, encode(run_ids))
        except Exception as exc:  # a waiter's fallback poll finds the run
            self._quiet_until = time.monotonic() + QUIET_AFTER_FAILURE
            log.debug("could not announce %d run(s): %s", len(run_ids), type(exc).__name__)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


_announcers: dict[int, Announcer] = {}
"""This process's announcer (by pid: a prefork child builds its own)."""


def _announcer(app: Any) -> Announcer:
    found = _announcers.get(os.getpid())
    if found is None:
        _announcers.clear()
        found = _announcers[os.getpid()] = Announcer(Settings.load(conf=app.conf))
    return found


def runs_moved(name: str, args: Sequence[Any], retval: Any, state: str | None) -> list[str]:
    """The runs a finished turn or cancel task may have settled; none when it certainly
    settled none.

    A turn that queued its run's next turn (`next`, the turn's status) or was sent
    again (a retry) leaves its run queued: announcing it would only wake waiters to
    read a status they are not waiting for. (An answer task names a request, not a
    run: see `_announce_after_task`. The sweeper's changes leave no waiter waiting:
    a run it re-queues is announced by its turn.)
    """
    if not args or state == "RETRY":
        return []
    if name == TURN_TASK:
        return [] if retval == "next" else [str(args[0])]
    if name == CANCEL_TASK:
        return [str(args[0])]
    return []


@task_postrun.connect
def _announce_after_task(
    sender: Any = None,
    args: Sequence[Any] | None = None,
    retval: Any = None,
    state: str | None = None,
    **_: Any,
) -> None:
    name = getattr(sender, "name", None)
    if name not in (TURN_TASK, CANCEL_TASK, ANSWER_TASK) or not args:
        return
    try:
        if name == ANSWER_TASK:
            # Its request's run: declining a budget ends the run in this very task.
            run_ids = [_run_of_request(sender.app, str(args[0]))]
        else:
            run_ids = runs_moved(name, args, retval, state)
        if run_ids:
            _announcer(sender.app).announce(run_ids)
    except Exception as exc:  # announcing must never fail a task
        log.debug("could not announce after %s: %s", name, type(exc).__name__)


def _run_of_request(app: Any, request_id: str) -> str:
    from tasks.runtime import Runtime  # the worker's runtime: the task just run built it

    return get_request(Runtime.current(app).db, request_id).run_id
